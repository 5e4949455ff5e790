"""The scores table of a ``ModelTransforms``: a daily asset whose partition ``ds`` is one
Ray Job (the model's inference module, from the same trainer archive).

Partition ``ds`` depends on the source table's partition ``ds`` and on the model
partition ``ds-1`` (or the champion), so retraining that model partition makes exactly
the scores it served stale. The job writes one file named by its attempt; the step
commits the partition (``_COMMITTED.json``) only when the job succeeded, so readers see
the old scores or the new ones, never a mix.
"""

import datetime as dt
import json
from typing import Any

import dagster as dg

from zipline_dagster.declarations.transforms import ModelTransforms
from zipline_dagster.errors import failure
from zipline_dagster.lineage.partitions import daily_partitions, starting_at, table_asset_key
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout.assets import champion_asset_key, model_asset_key
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.paths import (
    join_uri,
    model_archive_uri,
    model_dir_uri,
    table_partition_uri,
)
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import (
    begin_partition,
    commit_partition,
    existing_partitions,
    shift_day,
)
from zipline_dagster.training.assets import load_archive, trainable_partitions
from zipline_dagster.training.request import TrainingRequest, is_committed
from zipline_dagster.training.resources import TrainingLauncher


def scoring_partitions(transforms: ModelTransforms) -> dg.TimeWindowPartitionsDefinition:
    """From the day after the model's first trainable partition (day ds needs model ds-1)."""
    model_parts = trainable_partitions(transforms.model, daily_partitions)
    assert isinstance(model_parts, dg.TimeWindowPartitionsDefinition)
    return starting_at(model_parts, (model_parts.start.date() + dt.timedelta(days=1)).isoformat())


class ScoringError(RuntimeError):
    """What scoring a day needs is not there; the message names it."""


def scoring_request(
    transforms: ModelTransforms, ds: str, *, warehouse: str, model_dir: str
) -> TrainingRequest:
    model = transforms.model
    version, model_ds = model_dir.rstrip("/").split("/")[-2:]
    flags = (
        f"--input-table={transforms.source.table}",
        f"--ds={ds}",
        f"--model-dir={model_dir}",
        f"--output-table={transforms.table}",
        f"--warehouse={warehouse}",
        "--write-id=pending",  # the launcher names it after the attempt
        f"--passthrough={','.join(transforms.passthrough_fields)}",
    )
    return TrainingRequest(
        model=model,
        ds=ds,
        warehouse=warehouse,
        days=(ds,),
        model_dir=model_dir,
        archive_uri=model_archive_uri(model),
        flags=flags,
        module=transforms.inference_module,
        attempt_flag="write-id",
        job_key_override=f"score-{transforms.table.replace('.', '-')}-{version}-{model_ds}-{ds}",
    )


def resolve_model_dir(
    transforms: ModelTransforms, ds: str, warehouse: WarehouseResource
) -> tuple[str, str]:
    """(model partition URI, why that one) for scoring day ``ds``."""
    model = transforms.model
    store = warehouse.store(model.model_artifact_base_uri)
    if transforms.use_champion:
        pointer = ch.read_champion(store, model)
        if pointer is None:
            raise ScoringError(
                f"{transforms.table} {ds}: scored by the champion of {model.name}, which has "
                f"none yet ({ch.champion_uri(model)} is absent)"
            )
        return str(pointer["artifact_uri"]), f"champion {pointer['version']}/{pointer['ds']}"
    model_ds = shift_day(ds, -1)
    model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, model.version, model_ds)
    if not is_committed(store, model_dir, checksums=False):
        raise ScoringError(
            f"{transforms.table} {ds} is scored by {model.name} partition {model_ds} "
            f"(trained on data before {ds}), which is not trained: no finished model at "
            f"{model_dir}. Materialize models/{model.name} partition {model_ds} first."
        )
    return model_dir, f"partition {model_ds} (the day before)"


def build_scores_asset(
    transforms: ModelTransforms, *, automation_condition: dg.AutomationCondition | None = None
) -> dg.AssetsDefinition:
    model = transforms.model
    deps = [
        dg.AssetDep(
            table_asset_key(transforms.source.table),
            partition_mapping=dg.TimeWindowPartitionMapping(start_offset=0, end_offset=0),
        ),
        dg.AssetDep(champion_asset_key(model))
        if transforms.use_champion
        else dg.AssetDep(
            model_asset_key(model),
            partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1),
        ),
    ]

    @dg.asset(
        key=table_asset_key(transforms.table),
        group_name="scores",
        partitions_def=scoring_partitions(transforms),
        deps=deps,
        kinds={"ray", "parquet"},
        code_version=model.version,
        automation_condition=automation_condition,
        description=(
            f"{transforms.source.table} rows of day ds scored by {model.name} "
            + ("(its champion)" if transforms.use_champion else "partition ds-1")
            + f" with {transforms.inference_module}; passthrough "
            + (", ".join(transforms.passthrough_fields) or "none")
            + "."
        ),
        metadata={"zipline/table": transforms.table, "zipline/model_name": model.name},
        op_tags={"zipline/model": model.name},
    )
    def _scores(
        context: dg.AssetExecutionContext,
        launcher: TrainingLauncher,
        warehouse: WarehouseResource,
    ) -> dg.MaterializeResult:
        ds = context.partition_key
        try:
            model_dir, chosen = resolve_model_dir(transforms, ds, warehouse)
            wh_store = warehouse.store(warehouse.uri)
            if ds not in existing_partitions(wh_store, warehouse.uri, transforms.source.table):
                raise ScoringError(
                    f"{transforms.table} {ds}: source {transforms.source.table} partition {ds} "
                    "is missing (not committed); materialize it first"
                )
            archive, requirements = load_archive(model, warehouse)
        except (ScoringError, BlobStorageError, RuntimeError) as exc:
            raise failure(exc) from exc
        request = scoring_request(transforms, ds, warehouse=warehouse.uri, model_dir=model_dir)
        context.log.info(f"scoring {transforms.source.table} {ds} with {model.name} {chosen}")
        folder = table_partition_uri(warehouse.uri, transforms.table, ds)
        begin_partition(wh_store, folder)
        try:
            outcome = launcher.runner(context.log).run(
                request,
                archive=archive,
                requirements=requirements,
                metadata={"zipline_table": transforms.table, "zipline_ds": ds},
            )
        except Exception as exc:
            raise failure(exc) from exc
        name = f"part-{outcome.job_id}-00000.parquet"
        written = join_uri(folder, name)
        if not wh_store.exists(written):
            raise dg.Failure(
                f"the scoring job {outcome.job_id} succeeded but wrote no {written}; "
                f"{transforms.table} {ds} is left as it was"
            )
        import pandas as pd
        import pyarrow.parquet as pq

        frame = pq.read_table(__import__("io").BytesIO(wh_store.read_bytes(written))).to_pandas()
        commit_partition(wh_store, folder, [name], write_id=outcome.job_id, rows=len(frame))
        md: dict[str, Any] = {
            "rows": dg.MetadataValue.int(len(frame)),
            "model_dir": dg.MetadataValue.path(model_dir),
            "model_version": dg.MetadataValue.text(model_dir.rstrip("/").split("/")[-2]),
            "model_ds": dg.MetadataValue.text(model_dir.rstrip("/").split("/")[-1]),
            "scored_by": dg.MetadataValue.text(chosen),
            "uri": dg.MetadataValue.path(written),
            "job_id": dg.MetadataValue.text(outcome.job_id),
        }
        if len(frame):
            md["score_mean"] = dg.MetadataValue.float(float(frame["score"].mean()))
            md["score_p50"] = dg.MetadataValue.float(float(pd.Series(frame["score"]).median()))
        if outcome.job_url:
            md["ray_job"] = dg.MetadataValue.url(outcome.job_url)
        context.log.info(json.dumps({"scored_rows": len(frame), "uri": written}))
        return dg.MaterializeResult(metadata=md)

    return _scores
