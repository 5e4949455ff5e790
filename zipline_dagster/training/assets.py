"""Model assets: one daily-partitioned asset per declared ``Model``, trained as a Ray Job."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from zipline_runtime.contract import TableRead

from zipline_dagster.declarations.model import Model
from zipline_dagster.declarations.versions import (
    model_code_version,
    model_declaration,
    model_declaration_hash,
)
from zipline_dagster.errors import failure
from zipline_dagster.events import Listening, PartitionTrained, PlatformListener
from zipline_dagster.jobs.pins import Drift, drift_of
from zipline_dagster.jobs.ranges import Ran, run_days
from zipline_dagster.jobs.request import (
    JobRequest,
    TrainingDataError,
    TrainingJob,
    as_training,
    build_training_request,
    check_training_window,
    window_days,
)
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.lineage.ledger import ARTIFACT_ROOT, Ledger, prefixed
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
    daily_partitions,
    model_asset_key,
    table_asset_key,
    trainable_partitions,
)
from zipline_dagster.storage.artifacts import (
    ArtifactError,
    Promotion,
    promote_attempt,
    read_report,
)
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStorageError, BlobStore
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.champion_pointer import read_champion
from zipline_dagster.storage.paths import CARD_NAME, join_uri, model_root_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import window_snapshot
from zipline_dagster.training.card import CardInput, model_card
from zipline_dagster.training.metadata import report_metadata
from zipline_dagster.training.retries import reusable_partitions

#: The Dagster concurrency pool every model asset's training step is in.
TRAINING_POOL = "zipline_training"


def build_model_asset(
    *,
    model: Model,
    upstream_key: dg.AssetKey | None = None,
    partitions_def: dg.PartitionsDefinition = daily_partitions,
    group_name: str = "models",
    automation_condition: dg.AutomationCondition | None = None,
    partitions_per_run: int = PARTITIONS_PER_RUN,
    trainers: Path | None = None,
    drift: Drift | None = None,
) -> dg.AssetsDefinition:
    """A daily-partitioned asset whose partition ``ds`` trains ``model`` on Ray.

    Partition ``ds`` depends on exactly the N training-table partitions ``ds-(N-1)..ds``;
    its ``code_version`` is the trainer version and the hash of its declaration
    (``versions.model_code_version``), so a new version or a changed declaration shows it
    unsynced. With
    ``trainers`` (the project's trainer folders), a partition refuses to train while the
    model's source there builds to another version than it pins (``drift``, found at
    load, is shown in the asset's description).
    """
    n = model.window_days
    upstream = upstream_key or table_asset_key(model.table)
    partitions_def = trainable_partitions(model, partitions_def)

    @dg.asset(
        key=model_asset_key(model.name),
        group_name=group_name,
        partitions_def=partitions_def,
        # A backfill hands a run up to this many partitions; on Ray they train together
        # in one job (``ranges.run_days``), each still its own materialization.
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run),
        code_version=model_code_version(model),
        kinds={"ray", "python"},
        deps=[
            dg.AssetDep(
                upstream, partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-(n - 1))
            )
        ],
        description=(
            (f"WARNING: {drift.describe()}. " if drift is not None else "")
            + (f"{model.description} " if model.description else "")
            + f"Trains {model.name} (trainer version {model.version}) as a Ray Job on "
            f"{model.table} over a {n}-day window ending at the partition day; artifacts at "
            f"{join_uri(model_root_uri(model.model_artifact_base_uri, model.name), model.version)}/{{ds}}."
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
            ARTIFACT_ROOT: join_uri(
                model_root_uri(model.model_artifact_base_uri, model.name), model.version
            ),
            "zipline/input_table": model.table,
            "zipline/window_days": n,
        },
        automation_condition=automation_condition,
        op_tags={"zipline/model": model.name},
        # trainings share one pool: a deployment limits how many run at once
        # (`dagster instance concurrency set zipline_training N`); unlimited by default
        pool=TRAINING_POOL,
    )
    def _model_asset(
        context: dg.AssetExecutionContext,
        launcher: JobLauncher,
        warehouse: WarehouseResource,
        mlflow: PlatformListener,
    ) -> dg.MaterializeResult:
        drifted = drift_of(model, trainers)  # the source as it is now, not at load
        if drifted is not None:
            raise dg.Failure(f"refusing to train {model.name}: {drifted.describe()}")
        work = TrainingWork(
            context,
            model,
            warehouse,
            upstream,
            mlflow.listening(context.log.warning, context.log.info, warehouse.store),
        )
        return run_days(context, work, list(context.partition_keys), launcher, warehouse)

    return _model_asset


class TrainingWork:
    """Model partitions for ``run_days``: each day's window checked against the training
    table (listed once per step) and the ledger's rule applied to each of its days (a
    day committed by a run that ended without recording it is recorded from storage and
    trained on; one a run is still writing is refused); a successful attempt promoted."""

    verb, doing, runner, key_prefix = "trained", "training", "trainer", ""

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        model: Model,
        warehouse: WarehouseResource,
        upstream: dg.AssetKey,
        listening: Listening | None = None,
    ) -> None:
        self.context, self.model, self.warehouse, self.upstream = (
            context,
            model,
            warehouse,
            upstream,
        )
        self.listening = listening
        self.name = model.name
        # on Ray a range trains in one job, one task each, unless the model has its own
        # Ray Train workers
        self.together = model.training_conf.resource_config.workers == 0
        self.ledger = Ledger(context.instance)
        # the training table listed once for the step: the days of its windows
        needed = {d for ds in context.partition_keys for d in window_days(ds, model.window_days)}
        try:
            self.metadata, self.scan = warehouse.tables().state(model.table, only=needed)
        except (BlobStorageError, WarehouseError) as exc:
            raise failure(exc) from None
        self.files = {day: len(held.files) for day, held in self.scan.items()}

    def prepare(self, ds: str) -> TrainingJob:
        model = self.model
        try:
            days = window_days(ds, model.window_days)
            check_training_window(model, ds, days, have=self.files)
            read = TableRead(model.table, self.metadata or None, window_snapshot(self.scan, days))
            request = build_training_request(model, ds, warehouse=self.warehouse.uri, table=read)
            counts = {d: self.files[d] for d in days}
        except (TrainingDataError, BlobStorageError) as exc:
            raise failure(exc) from None
        in_flight = {}
        for day in request.days:
            warn = prefixed(self.context.log.warning, f"{model.table} {day}")
            why = self.ledger.admit(self.upstream, day, self.scan[day].commit, warn)
            if why:
                in_flight[day] = why
        if in_flight:
            raise dg.Failure(
                f"model {model.name!r} partition {ds}: training table {model.table} is still "
                "being written for "
                + "; ".join(f"{day} ({why})" for day, why in in_flight.items())
                + ". Train it once that run has ended, so that it trains on what Dagster records"
            )
        self.context.log.info(
            f"{ds}: window {request.start_ds}..{request.end_ds} at snapshot {read.snapshot_id}, "
            f"data files per day {counts}"
        )
        return request

    def reuse(self, ready: list[JobRequest]) -> dict[str, dict[str, Any]]:
        return reusable_partitions(
            self.context, [as_training(r) for r in ready], self.warehouse, self.scan
        )

    def begin(self, request: JobRequest) -> None:
        pass

    def finish(self, request: JobRequest, ran: Ran) -> dict[str, Any]:
        return finish_partition(self.context, as_training(request), ran, self.listening)


def input_read(request: TrainingJob) -> dict[str, Any]:
    """The input table, its metadata file and the snapshot the job read."""
    return request.invocation.read.to_json()


def write_card(
    context: dg.AssetExecutionContext,
    artifacts: BlobStore,
    request: TrainingJob,
    ran: Ran,
    report: Mapping[str, Any],
    read: dict[str, Any],
) -> str:
    """The partition's card (``training.card``), also written beside its artifacts (a
    view of the partition, not in its manifest: a card that could not be written is a
    warning, never a failed partition)."""
    model = request.model
    try:
        champion = read_champion(artifacts, model)
    except (BlobStorageError, ValueError):  # unreadable: the card says none is known
        champion = None
    card = model_card(
        CardInput(
            model=model,
            ds=request.ds,
            code_version=model_code_version(model),
            archive_uri=request.archive_uri,
            window=list(request.days),
            input=read,
            flags=list(request.flags),
            report=report,
            cost=ran.cost,
            champion=champion,
        )
    )
    try:
        artifacts.write_bytes(join_uri(request.canonical_dir, CARD_NAME), card.encode())
    except BlobStorageError as exc:
        context.log.warning(f"{model.name} {request.ds}: its card was not written ({exc})")
    return card


def _promote(
    context: dg.AssetExecutionContext,
    artifacts: BlobStore,
    request: TrainingJob,
    ran: Ran,
    read: dict[str, Any],
) -> tuple[Promotion, Mapping[str, Any], bytes | None]:
    """The attempt promoted (what happened said in the step's log); its report and PR
    curve.

    Raises:
        dg.Failure: the attempt's artifacts do not satisfy the contract (named).
    """
    model, ds = request.model, request.ds
    try:
        promotion = promote_attempt(
            artifacts,
            request.canonical_dir,
            ran.job_id,
            extra={
                "model": model.name,
                "version": model.version,
                # what the partition was trained under: a retrain after the declaration
                # changed is a new attempt of the same {version}/{ds}
                "code_version": model_code_version(model),
                "declaration": model_declaration(model),
                "ds": ds,
                "window": list(request.days),
                "job_id": ran.job_id,
                "launcher": ran.launcher,
                "archive_uri": request.archive_uri,
                # the job-side runtime build it ran with, beside the archive
                "runtime_version": model.runtime,
                "dagster_run_id": context.run.run_id,
                # what MLflow logs as params, also for a partition logged from storage
                "flags": list(request.flags),
                # the Iceberg snapshot it read: `reproduce` reads it again
                "input": read,
                # what the trainer was given, typed (``flags`` is its form)
                "invocation": request.invocation.to_json(),
            },
        )
        report = promotion.report or read_report(artifacts, request.canonical_dir)
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
        context.log.info(f"attempt {ran.job_id} had already been promoted by another run")
    if promotion.left_behind:
        context.log.warning(
            f"{model.version}/{ds} is committed, but these could not be deleted (never read; "
            f"a stale lock is broken by the next promotion): {', '.join(promotion.left_behind)}"
        )
    return promotion, report, png


def finish_partition(
    context: dg.AssetExecutionContext,
    request: TrainingJob,
    ran: Ran,
    listening: Listening | None = None,
) -> dict[str, Any]:
    """Promote the attempt ``ran`` wrote into ``{version}/{ds}/`` (the earlier finished
    model is superseded only now, the manifest written last); the partition's metadata,
    with what the listener recorded (a link to its MLflow run) when one listens.

    Raises:
        dg.Failure: the attempt's artifacts do not satisfy the contract (named).
    """
    model, ds = request.model, request.ds
    read = input_read(request)
    artifacts = context.resources.warehouse.store(request.canonical_dir)
    promotion, report, png = _promote(context, artifacts, request, ran, read)
    metadata: dict[str, Any] = {
        "version": model.version,
        "declaration_hash": model_declaration_hash(model),
        "archive_uri": request.archive_uri,
        "runtime_version": model.runtime,
        "artifact_uri": request.canonical_dir,
        "attempt": ran.job_id,
        "launcher": ran.launcher,
        "job_seconds": dg.MetadataValue.float(round(ran.seconds, 3)),
        "reattached": ran.attached,
        "window": f"{request.start_ds}..{request.end_ds}",
        "input_snapshot_id": str(read["snapshot_id"]),
        "input_table_metadata": dg.MetadataValue.path(str(read["metadata"])),
        "artifact_files": dg.MetadataValue.json(promotion.manifest.paths),
        **({"range": ran.span} if ran.span else {}),
        **report_metadata(report, pr_curve_png=png),
    }
    if ran.cost is not None:
        rows = sum(int((report.get(s) or {}).get("rows") or 0) for s in ("train", "holdout"))
        metadata.update(ran.cost.metadata(rows or None))
    metadata["card"] = dg.MetadataValue.md(
        write_card(context, artifacts, request, ran, report, read)
    )
    metadata["ray_job_id" if ran.launcher == "ray" else "job_id"] = ran.job_id
    if ran.url:
        metadata["ray_dashboard"] = dg.MetadataValue.url(ran.url)
    if promotion.superseded:
        metadata["superseded_artifacts"] = promotion.superseded
    if listening is not None:
        event = PartitionTrained(
            model=model.name,
            asset_key=context.asset_key.to_user_string(),
            ds=ds,
            version=model.version,
            attempt=promotion.manifest.attempt or ran.job_id,
            artifact_uri=request.canonical_dir,
            report=report,
            dagster_run_id=context.run.run_id,
            flags=request.flags,
            files=promotion.manifest.paths,
        )
        metadata.update(listening.partition_trained(event))
    return metadata
