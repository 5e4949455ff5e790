"""Shared Dagster conventions: the one daily partitions definition every feature, label,
table and model uses, the asset key of a table, how a step over a range of partitions
records each of them, and a partition's latest materialization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from zipline_dagster.declarations.model import Model

PARTITIONS_START = "2026-07-01"

#: The metadata key of a scores day (and of its monitoring) naming the model partition
#: that scored it: ds-1, or an older one when ds-1 failed its gates.
SCORED_BY = "model_ds"


def scored_by(metadata: Mapping[str, Any]) -> str | None:
    """The model partition a scores day's metadata says scored it (None: not said)."""
    value = metadata.get(SCORED_BY)
    return None if value is None else str(getattr(value, "value", value))


daily_partitions = dg.DailyPartitionsDefinition(start_date=PARTITIONS_START)

#: Most partitions one backfill run covers (model partitions, scores and monitoring days;
#: on Ray a range trains or scores in one job, one task each).
PARTITIONS_PER_RUN = 30


def latest_materialization(
    instance: dg.DagsterInstance, key: dg.AssetKey, ds: str
) -> dg.EventLogRecord | None:
    """The record of the latest materialization of ``key`` partition ``ds`` (None: none)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[ds]), limit=1
    ).records
    return records[0] if records else None


def latest_metadata(
    instance: dg.DagsterInstance, key: dg.AssetKey, ds: str
) -> dict[str, Any] | None:
    """The metadata values of the latest materialization of ``key`` partition ``ds``
    (None: none)."""
    record = latest_materialization(instance, key, ds)
    mat = record.asset_materialization if record is not None else None
    return {k: v.value for k, v in mat.metadata.items()} if mat is not None else None


def model_asset_key(model_name: str) -> dg.AssetKey:
    """A model's partitions are the asset ``models/{model_name}``."""
    return dg.AssetKey(["models", model_name])


def champion_asset_key(model_name: str) -> dg.AssetKey:
    """A model's champion pointer is the asset ``champions/{model_name}``."""
    return dg.AssetKey(["champions", model_name])


def table_asset_key(table: str) -> dg.AssetKey:
    """The asset producing table ``ns.name`` has the key ``ns/name``."""
    return dg.AssetKey(table.split("."))


def starting_at(
    partitions_def: dg.TimeWindowPartitionsDefinition, start: str
) -> dg.TimeWindowPartitionsDefinition:
    """The same time partitions (schedule, format, zone), from day ``start`` on."""
    return dg.TimeWindowPartitionsDefinition(
        start=start,
        fmt=partitions_def.fmt,
        cron_schedule=partitions_def.cron_schedule,
        timezone=partitions_def.timezone,
        end_offset=partitions_def.end_offset,
    )


def record_range(
    context: dg.AssetExecutionContext,
    days: Sequence[str],
    done: dict[str, dict[str, Any]],
    errors: dict[str, str],
    *,
    name: str,
    verb: str,
    code_version: str | None = None,
    data_versions: dict[str, str] | None = None,
) -> dg.MaterializeResult:
    """A range step's outcome in Dagster: each finished partition its own materialization
    with its own metadata; when any failed, exactly the finished ones are recorded and
    the step fails naming each failed partition and why (``verb``: what finishing one
    means, for the message). ``data_versions``: each day's (an Iceberg snapshot); Dagster
    takes one data version per step, so it is given for a step of one day only (a range's
    days each name theirs in their metadata: dagster-io/dagster#34013)."""
    if not errors:
        for ds, md in done.items():
            context.add_asset_metadata(md, partition_key=ds)
        if data_versions and len(days) == 1 and days[0] in data_versions:
            return dg.MaterializeResult(data_version=dg.DataVersion(data_versions[days[0]]))
        return dg.MaterializeResult()
    for ds, md in done.items():
        context.log_event(
            dg.AssetMaterialization(
                asset_key=context.asset_key,
                partition=ds,
                metadata=md,
                tags={"dagster/code_version": code_version} if code_version else None,
            )
        )
    lines = "\n".join(f"- {ds}: {why}" for ds, why in sorted(errors.items()))
    raise dg.Failure(
        description=(
            f"{len(errors)} of {len(days)} partitions of {name} failed "
            f"({len(done)} {verb} and materialized):\n{lines}"
        ),
        metadata={
            "failed_partitions": dg.MetadataValue.json(sorted(errors)),
            "materialized_partitions": dg.MetadataValue.json(sorted(done)),
        },
    )


def trainable_partitions(
    model: Model, partitions_def: dg.PartitionsDefinition
) -> dg.PartitionsDefinition:
    """The partitions a model may train: none whose window reaches before its training
    query's ``start_partition`` (so the UI never offers them as missing)."""
    first = model.first_partition
    if first is None or not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        return partitions_def
    start = partitions_def.start.date().isoformat()
    if first <= start:
        return partitions_def
    return starting_at(partitions_def, first)
