"""The definitions builder (the top floor): wires producers (features), models
(training), their gates and champion (rollout), scores and monitoring into one
``Definitions``, through the table registry.

Every table resolves, by its exact name, to the asset producing it.

A model (or producer) whose input table no asset emits fails when the code location
loads, listing the closest names: a near miss (a catalog qualifier, a typo) would
otherwise make the platform treat the table as external and train on stale data. A
table that truly comes from outside is declared with ``ExternalTable`` and its
partitions are then observed in the warehouse, never assumed fresh.
"""

import difflib
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from zipline_dagster.declarations.features import Producer, output_columns
from zipline_dagster.declarations.model import Model, ModelSpecError
from zipline_dagster.declarations.transforms import ModelTransforms
from zipline_dagster.features.assets import build_producer_asset
from zipline_dagster.jobs.pins import find_drift
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.lineage.automation import automation_sensor, retrain_condition
from zipline_dagster.lineage.partitions import (
    daily_partitions,
    table_asset_key,
    trainable_partitions,
)
from zipline_dagster.rollout.assets import (
    build_champion_asset,
    build_champion_sensor,
    build_model_checks,
)
from zipline_dagster.rollout.maintenance import build_maintenance
from zipline_dagster.scoring.assets import build_scores_asset, scoring_partitions
from zipline_dagster.scoring.drift import build_drift_checks
from zipline_dagster.scoring.monitoring import (
    build_monitoring_asset,
    build_monitoring_checks,
    build_rescoring_sensor,
    monitoring_asset_key,
)
from zipline_dagster.settings import settings
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.paths import model_archive_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import Tables
from zipline_dagster.tracking import MlflowResource
from zipline_dagster.training.assets import build_model_asset

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExternalTable:
    """A table no asset here produces (e.g. written by another team's pipeline)."""

    table: str
    description: str = ""


@dataclass(frozen=True)
class SourceTable:
    """A table produced by a plain asset you wrote (e.g. an ingestion step)."""

    table: str
    asset: dg.AssetsDefinition


def closest_tables(table: str, known: Sequence[str], n: int = 3) -> list[str]:
    """Near misses first: a known name the given one ends with (catalog qualifier), then
    spelling neighbours."""
    suffix = [k for k in known if table.endswith("." + k) or k.endswith("." + table)]
    fuzzy = difflib.get_close_matches(table, known, n=n, cutoff=0.5)
    out: list[str] = []
    for k in suffix + fuzzy:
        if k not in out:
            out.append(k)
    return out[:n]


def resolve_table(
    table: str, known: Mapping[str, dg.AssetKey], *, who: str, field: str
) -> dg.AssetKey:
    if table in known:
        return known[table]
    close = closest_tables(table, sorted(known))
    hint = (
        f"closest: {', '.join(close)}"
        if close
        else f"known tables: {', '.join(sorted(known)) or 'none'}"
    )
    raise ModelSpecError(
        f"{who}: {field}={table!r} is not emitted by any asset in these definitions ({hint}). "
        "Use the exact name its producer emits; a table that truly comes from outside must be "
        "declared with ExternalTable(...) so its partitions are observed, not assumed fresh."
    )


def check_columns(
    who: str, fld: str, columns: Sequence[str], producer: Producer | None, table: str
) -> None:
    """``columns`` (named by ``who``'s ``fld``) must be columns of ``table``, where its
    producer's declaration fixes them (``output_columns``); a miss names the closest."""
    have = output_columns(producer) if producer is not None else None
    missing = [c for c in columns if have is not None and c not in have]
    if have is None or not missing:
        return
    close = sorted({c for m in missing for c in difflib.get_close_matches(m, have, n=3)})
    raise ModelSpecError(
        f"{who}: {fld} names {missing}, which {type(producer).__name__} "
        f"{producer.name!r} does not emit into {table}"  # type: ignore[union-attr]
        + (f" (closest: {', '.join(close)})" if close else "")
        + f"; it emits: {', '.join(have)}"
    )


def check_model_columns(model: Model, producer: Producer | None) -> None:
    """The model's selected columns and its ``label-column`` flag must be columns of its
    training table, where the producer's declaration fixes them."""
    who = f"Model {model.name!r}"
    fld = "training_conf.training_data_source.query.selects"
    check_columns(who, fld, model.columns, producer, model.table)
    label = model.training_conf.job_configs.get("label-column")
    if label is not None:
        fld = "training_conf.job_configs['label-column']"
        check_columns(who, fld, [label], producer, model.table)


def check_transforms_columns(mt: ModelTransforms, producers: Mapping[str, Producer]) -> None:
    """A monitored scores table's label column and join keys must be columns of its
    labels table, where the producer's declaration fixes them."""
    if mt.labels is None:
        return
    who, table = f"ModelTransforms of {mt.model.name!r}", mt.labels.table
    check_columns(who, "label_column", [mt.label_column], producers.get(table), table)
    check_columns(who, "label_keys", list(mt.label_keys), producers.get(table), table)


def observed_versions(tables: Tables, table: str) -> dict[str, str]:
    """{ds: data version} of an external table's committed days: the Iceberg snapshot that
    last wrote each day (read from the catalog's metadata; no data file is read, however
    large the table)."""
    return {
        ds: day.data_version
        for ds, day in tables.days(table).items()
        if daily_partitions.has_partition_key(ds)
    }


# An ExternalTable is observed per partition by an observable source asset, marked beta;
# we rely on it deliberately and say so once here instead of at every load.
warnings.filterwarnings("ignore", category=dg.BetaWarning, message=".*observable_source_asset.*")


def build_external_table_asset(ext: ExternalTable) -> dg.SourceAsset:
    @dg.observable_source_asset(
        key=table_asset_key(ext.table),
        partitions_def=daily_partitions,
        group_name="external",
        description=ext.description or f"external table {ext.table}, observed in the warehouse",
    )
    def _observe(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.DataVersionsByPartition:
        try:
            versions = observed_versions(warehouse.tables(), ext.table)
        except WarehouseError as exc:
            raise dg.Failure(f"external table {ext.table}: {exc}") from None
        context.log.info(f"observed {len(versions)} partitions of {ext.table}")
        return dg.DataVersionsByPartition({k: dg.DataVersion(v) for k, v in versions.items()})

    return _observe


def check_archive_reachable(model: Model, resources: Mapping[str, Any]) -> None:
    """The configured launcher can run the model's archive from where it is stored.

    Raises:
        ModelSpecError: naming the model, the archive's scheme and the reason.
    """
    launcher = resources.get("launcher")
    if not isinstance(launcher, JobLauncher):
        return
    warehouse = resources.get("warehouse")
    options = (
        warehouse.storage_options()
        if isinstance(warehouse, WarehouseResource)
        else settings().storage_options
    )
    uri = model_archive_uri(model)
    problem = launcher.archive_problem(uri, options)
    if problem:
        scheme = uri.split("://", 1)[0]
        raise ModelSpecError(
            f"Model {model.name!r}: its trainer archive {uri} cannot be run by the "
            f"{type(launcher).__name__} launcher from {scheme}://: {problem}. Put "
            "model_artifact_base_uri on storage the cluster can fetch, or use "
            "ZIPLINE_LAUNCHER=local."
        )


def emitted_tables(
    sources: Sequence[SourceTable],
    external_tables: Sequence[ExternalTable],
    producers: Sequence[Producer],
    transforms: Sequence[ModelTransforms],
) -> dict[str, dg.AssetKey]:
    """{table: the asset that emits it}.

    Raises:
        ModelSpecError: a table is emitted twice, naming both.
    """
    known: dict[str, dg.AssetKey] = {}
    owners: dict[str, str] = {}
    emitters = [(s.table, f"source asset {s.asset.key.to_user_string()}") for s in sources]
    emitters += [(e.table, "ExternalTable") for e in external_tables]
    emitters += [(p.table, f"{type(p).__name__} {p.name!r}") for p in producers]
    emitters += [(mt.table, f"ModelTransforms of {mt.model.name!r}") for mt in transforms]
    for table, owner in emitters:
        if table in known:
            raise ModelSpecError(
                f"table {table!r} is emitted twice: by {owners[table]} and by {owner}"
            )
        known[table] = table_asset_key(table)
        owners[table] = owner
    return known


def check_inputs(
    known: Mapping[str, dg.AssetKey],
    producers: Sequence[Producer],
    models: Sequence[Model],
    transforms: Sequence[ModelTransforms],
    resources: Mapping[str, Any],
) -> None:
    """Every table read resolves to an emitted one, every column named is one its
    producer emits, every model's archive is reachable by the launcher, and every
    ModelTransforms' model is among ``models``.

    Raises:
        ModelSpecError: naming the declaration, the field and the closest names.
    """
    for p in producers:
        for t in p.upstream_tables:
            resolve_table(t, known, who=f"{type(p).__name__} {p.name!r}", field="input table")
    by_table = {p.table: p for p in producers}
    for m in models:
        resolve_table(
            m.table,
            known,
            who=f"Model {m.name!r}",
            field="training_conf.training_data_source.table",
        )
        check_model_columns(m, by_table.get(m.table))
        check_archive_reachable(m, resources)
    trained = {m.name: m for m in models}
    for mt in transforms:
        who = f"ModelTransforms of {mt.model.name!r}"
        if trained.get(mt.model.name) != mt.model:
            raise ModelSpecError(
                f"{who}: its model is not among the models of these definitions "
                f"(declared: {', '.join(sorted(trained)) or 'none'}); declare it too"
            )
        resolve_table(mt.source.table, known, who=who, field="sources[0].table")
        if mt.labels is not None:
            resolve_table(mt.labels.table, known, who=who, field="labels.table")
        check_transforms_columns(mt, by_table)
    for m in models:
        _check_judged_live(m, transforms)


def _check_judged_live(model: Model, transforms: Sequence[ModelTransforms]) -> None:
    """A rollout judged on live days needs a monitored scores table of the model."""
    r = model.rollout
    wants = (
        "kind='shadow'"
        if r.shadow
        else (f"rollback_after_days={r.rollback_after_days}" if r.rollback_after_days else None)
    )
    if wants and not live_keys(model, transforms):
        raise ModelSpecError(
            f"Model {model.name!r}: its RolloutStrategy({wants}) is judged on monitored days, "
            "but no ModelTransforms of it declares labels (none is monitored), so it would "
            "never act; declare labels= on one of its ModelTransforms"
        )


def live_keys(model: Model, transforms: Sequence[ModelTransforms]) -> list[dg.AssetKey]:
    """The monitoring assets of ``model``'s scores: its champion's live metrics."""
    return [
        monitoring_asset_key(mt)
        for mt in transforms
        if mt.labels is not None and mt.model.name == model.name
    ]


def sensors(
    models: Sequence[Model], transforms: Sequence[ModelTransforms]
) -> list[dg.SensorDefinition]:
    """Automation's: its own sensor, the champions' and the rescoring one."""
    out: list[dg.SensorDefinition] = [automation_sensor()]
    if models:
        live = {
            m.name: live_keys(m, transforms)
            for m in models
            if m.rollout.rollback_after_days or m.rollout.shadow
        }
        out.append(build_champion_sensor(list(models), live=live))
    if transforms:
        out.append(build_rescoring_sensor(list(transforms)))
    return out


def maintenance_of(
    sources: Sequence[SourceTable],
    producers: Sequence[Producer],
    transforms: Sequence[ModelTransforms],
    models: Sequence[Model],
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The ``warehouse_maintenance`` job and schedule over every table these write (not
    the external ones: another team keeps those)."""
    ours = [s.table for s in sources] + [p.table for p in producers] + [t.table for t in transforms]
    return build_maintenance(ours, models, running=settings().warehouse_maintenance)


def build_definitions(
    *,
    producers: Sequence[Producer] = (),
    models: Sequence[Model] = (),
    sources: Sequence[SourceTable] = (),
    external_tables: Sequence[ExternalTable] = (),
    transforms: Sequence[ModelTransforms] = (),
    resources: Mapping[str, Any] | None = None,
    extra_assets: Sequence[Any] = (),
    automation: bool = True,
    trainers: Path | None = None,
) -> dg.Definitions:
    """Definitions for producers, models (with their blocking checks and champion) and
    model transforms (scores tables, monitoring), every table name checked at load time.

    ``trainers``: the project's trainer folders (``{trainers}/{model_name}``): a model
    whose source there builds to another version than it pins is named in a warning (the
    log, and its asset's description in the UI) and refuses to train (``jobs.pins``).

    Raises:
        ModelSpecError: a table is produced twice, an input table resolves to no asset, or
            a ModelTransforms names a model these definitions do not train.
    """
    known = emitted_tables(sources, external_tables, producers, transforms)
    check_inputs(known, producers, models, transforms, resources or {})

    condition = retrain_condition() if automation else None
    assets: list[Any] = [s.asset for s in sources]
    assets += [build_external_table_asset(e) for e in external_tables]
    assets += [build_producer_asset(p, automation_condition=condition) for p in producers]
    drifts = {d.model: d for d in find_drift(models, trainers)}
    for drift in drifts.values():
        log.warning(drift.describe())
    assets += [
        build_model_asset(
            model=m, automation_condition=condition, trainers=trainers, drift=drifts.get(m.name)
        )
        for m in models
    ]
    checks: list[Any] = []
    for m in models:
        checks += build_model_checks(m, trainable_partitions(m, daily_partitions))
        assets.append(build_champion_asset(m, live_keys=live_keys(m, transforms)))
    for mt in transforms:
        assets.append(build_scores_asset(mt, automation_condition=condition))
        checks += build_drift_checks(mt, scoring_partitions(mt))
        if mt.labels is not None:
            assets.append(build_monitoring_asset(mt, automation_condition=condition))
            checks += build_monitoring_checks(mt)
    assets += list(extra_assets)
    upkeep, schedule = maintenance_of(sources, producers, transforms, models)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[upkeep],
        schedules=[schedule],
        sensors=sensors(models, transforms) if automation else [],
        # MLflow is off unless configured (MLFLOW_TRACKING_URI, or a resource given here)
        resources={"mlflow": MlflowResource.from_settings(), **(resources or {})},
        # One process per run: Spark starts once per run and steps share it.
        executor=dg.in_process_executor,
    )
