"""Model assets: one daily-partitioned asset per declared ``Model``, trained as a Ray Job."""

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.errors import failure
from zipline_dagster.lineage.partitions import daily_partitions, starting_at, table_asset_key
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStorageError
from zipline_dagster.storage.paths import join_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.archive import (
    ArchiveVerificationError,
    TrainerArchiveError,
    load_verified_archive,
)
from zipline_dagster.training.metadata import report_metadata
from zipline_dagster.training.request import (
    ArtifactError,
    TrainingDataError,
    TrainingJobError,
    build_training_request,
    check_training_window,
    promote_attempt,
    read_install_requires,
    read_report,
)
from zipline_dagster.training.resources import TrainingLauncher


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


def load_archive(model: Model, warehouse: WarehouseResource) -> tuple[bytes, list[str]]:
    """The model's verified trainer archive and its ``install_requires``.

    Raises:
        ArchiveVerificationError, TrainerArchiveError, BlobStorageError: naming the path.
    """
    archive_uri, archive = load_verified_archive(
        base=model.model_artifact_base_uri,
        model_name=model.name,
        version=model.version,
        options=warehouse.storage_options(),
    )
    return archive, read_install_requires(archive, uri=archive_uri)


def build_model_asset(
    *,
    model: Model,
    upstream_key: dg.AssetKey | None = None,
    partitions_def: dg.PartitionsDefinition = daily_partitions,
    group_name: str = "models",
    automation_condition: dg.AutomationCondition | None = None,
) -> dg.AssetsDefinition:
    """A daily-partitioned asset whose partition ``ds`` trains ``model`` on Ray.

    Partition ``ds`` depends on exactly the N training-table partitions ``ds-(N-1)..ds``;
    its ``code_version`` is the trainer version, so a new version shows it unsynced.
    """
    n = model.window_days
    upstream = upstream_key or table_asset_key(model.table)
    partitions_def = trainable_partitions(model, partitions_def)

    @dg.asset(
        name=model.name,
        key_prefix=["models"],
        group_name=group_name,
        partitions_def=partitions_def,
        code_version=model.version,
        kinds={"ray", "python"},
        deps=[
            dg.AssetDep(
                upstream, partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-(n - 1))
            )
        ],
        description=(
            f"Trains {model.name} (trainer version {model.version}) as a Ray Job on "
            f"{model.table} over a {n}-day window ending at the partition day; artifacts at "
            f"{join_uri(model.model_artifact_base_uri, 'models', model.name, model.version)}/{{ds}}."
        ),
        metadata={
            **(
                {
                    "zipline/start_partition": model.training_conf.training_data_source.query.start_partition
                }
                if model.first_partition
                else {}
            ),
            "zipline/model_name": model.name,
            "zipline/version": model.version,
            "zipline/input_table": model.table,
            "zipline/window_days": n,
        },
        automation_condition=automation_condition,
        op_tags={"zipline/model": model.name},
    )
    def _model_asset(
        context: dg.AssetExecutionContext, launcher: TrainingLauncher, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        ds = context.partition_key
        request = build_training_request(model, ds, warehouse=warehouse.uri)
        artifacts = warehouse.store(request.canonical_dir)
        try:
            counts = check_training_window(warehouse.store(request.warehouse), request)
            archive, requirements = load_archive(model, warehouse)
        except (
            TrainingDataError,
            ArchiveVerificationError,
            TrainerArchiveError,
            BlobStorageError,
        ) as exc:
            raise failure(exc) from None
        context.log.info(
            f"window {request.start_ds}..{request.end_ds}: parquet files per day {counts}"
        )

        from zipline_dagster.training.launchers.ray_head import RayHeadError
        from zipline_dagster.training.launchers.ray_job import RayUnreachableError, job_metadata

        try:
            runner = launcher.runner(context.log)
            outcome = runner.run(
                request,
                archive=archive,
                requirements=requirements,
                metadata=job_metadata(
                    model=model.name,
                    version=model.version,
                    ds=ds,
                    dagster_run_id=context.run.run_id,
                ),
            )
        except TrainingJobError as exc:
            raise failure(
                exc,
                job_id=exc.job_id or "",
                trainer_log_tail=dg.MetadataValue.md(f"```\n{exc.logs_tail}\n```"),
            ) from None
        except (RayUnreachableError, RayHeadError) as exc:
            raise failure(exc) from None

        # The attempt succeeded: promote it into {version}/{ds}/ (the earlier finished
        # model is superseded only now, and the manifest is written last).
        attempt_id = outcome.model_dir.rstrip("/").rsplit("/", 1)[1]
        try:
            promotion = promote_attempt(
                artifacts,
                request.canonical_dir,
                attempt_id,
                extra={
                    "model": model.name,
                    "version": model.version,
                    "ds": ds,
                    "window": list(request.days),
                    "job_id": outcome.job_id,
                    "launcher": outcome.launcher,
                    "archive_uri": request.archive_uri,
                    "dagster_run_id": context.run.run_id,
                },
            )
            report = read_report(artifacts, request.canonical_dir)
            try:
                png: bytes | None = artifacts.read_bytes(
                    join_uri(request.canonical_dir, "pr_curve.png")
                )
            except BlobNotFoundError:
                png = None
        except (ArtifactError, BlobStorageError) as exc:
            raise failure(exc) from None
        if promotion.superseded:
            context.log.info(
                f"earlier artifacts of {model.version}/{ds} moved to {promotion.superseded}"
            )
        if promotion.already:
            context.log.info(f"attempt {attempt_id} had already been promoted by another run")

        metadata = {
            "version": model.version,
            "archive_uri": request.archive_uri,
            "artifact_uri": request.canonical_dir,
            "attempt": attempt_id,
            "launcher": outcome.launcher,
            "job_seconds": dg.MetadataValue.float(round(outcome.seconds, 3)),
            "reattached": outcome.attached,
            "window": f"{request.start_ds}..{request.end_ds}",
            "artifact_files": dg.MetadataValue.json(
                [f["path"] for f in promotion.manifest["files"]]
            ),
            **report_metadata(report, pr_curve_png=png),
        }
        if outcome.launcher == "ray":
            metadata["ray_job_id"] = outcome.job_id
            metadata["ray_dashboard"] = dg.MetadataValue.url(outcome.job_url or "")
        else:
            metadata["job_id"] = outcome.job_id
        if promotion.superseded:
            metadata["superseded_artifacts"] = promotion.superseded
        return dg.MaterializeResult(metadata=metadata)

    return _model_asset
