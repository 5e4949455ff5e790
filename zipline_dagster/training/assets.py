"""Model assets: one daily-partitioned asset per declared ``Model``, trained as a Ray Job."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.errors import failure
from zipline_dagster.lineage.ledger import ARTIFACT_ROOT, Difference, Ledger, State
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
    daily_partitions,
    model_asset_key,
    record_range,
    starting_at,
    table_asset_key,
)
from zipline_dagster.storage.artifacts import (
    ArtifactError,
    promote_attempt,
    read_report,
)
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStorageError
from zipline_dagster.storage.commits import Commit
from zipline_dagster.storage.paths import join_uri, model_root_uri, table_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import committed_scan
from zipline_dagster.training.archive import (
    ArchiveVerificationError,
    TrainerArchiveError,
    load_verified_archive,
)
from zipline_dagster.training.metadata import report_metadata
from zipline_dagster.training.pins import Drift, drift_of
from zipline_dagster.training.request import (
    TrainingDataError,
    TrainingJobError,
    TrainingRequest,
    build_range_request,
    build_training_request,
    check_training_window,
    read_install_requires,
    traceback_tail,
)
from zipline_dagster.training.resources import TrainingLauncher
from zipline_dagster.training.retries import reusable_partitions


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
    partitions_per_run: int = PARTITIONS_PER_RUN,
    trainers: Path | None = None,
    drift: Drift | None = None,
) -> dg.AssetsDefinition:
    """A daily-partitioned asset whose partition ``ds`` trains ``model`` on Ray.

    Partition ``ds`` depends on exactly the N training-table partitions ``ds-(N-1)..ds``;
    its ``code_version`` is the trainer version, so a new version shows it unsynced. With
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
        # in one job (``train_range``), each still its own materialization.
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run),
        code_version=model.version,
        kinds={"ray", "python"},
        deps=[
            dg.AssetDep(
                upstream, partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-(n - 1))
            )
        ],
        description=(
            (f"WARNING: {drift.describe()}. " if drift is not None else "")
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
    )
    def _model_asset(
        context: dg.AssetExecutionContext, launcher: TrainingLauncher, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        days = list(context.partition_keys)
        drifted = drift_of(model, trainers)  # the source as it is now, not at load
        if drifted is not None:
            raise dg.Failure(f"refusing to train {model.name}: {drifted.describe()}")
        # the ledger's rule for each training-table day (Dagster's record read once per day)
        ledger = Ledger(context.instance)

        def settle(day: str, commit: Commit) -> Difference:
            diff = ledger.settle(upstream, day, commit)
            if diff.state is State.RECORDED:
                context.log.warning(f"{model.table} {day}: {diff.describe()}")
            return diff

        if len(days) == 1:
            return dg.MaterializeResult(
                metadata=train_partition(
                    context, model, days[0], launcher, warehouse, settle=settle
                )
            )
        return train_range(context, model, days, launcher, warehouse, settle=settle)

    return _model_asset


def _job_failure(exc: TrainingJobError) -> dg.Failure:
    return failure(  # type: ignore[return-value]
        exc,
        job_id=exc.job_id or "",
        trainer_log_tail=dg.MetadataValue.md(f"```\n{exc.logs_tail}\n```"),
    )


def prepare(
    model: Model,
    ds: str,
    warehouse: WarehouseResource,
    *,
    scan: dict[str, tuple[list[str], Commit]] | None = None,
    settle: Callable[[str, Commit], Difference] | None = None,
) -> tuple[TrainingRequest, dict[str, int]]:
    """The partition's request, after checking its window exists and applying the
    ledger's rule to each of its days (``settle``: a day's commit -> its ``Difference``;
    a day committed by a run that ended without recording it is recorded from storage and
    trained on). ``scan``: the training table's ``committed_scan``, when the caller
    already holds it.

    Raises:
        TrainingDataError: a window day is missing, or a run is still writing it.
    """
    request = build_training_request(model, ds, warehouse=warehouse.uri)
    store = warehouse.store(request.warehouse)
    if scan is None:
        scan = committed_scan(store, table_uri(warehouse.uri, model.table))
    have = {day: len(files) for day, (files, _) in scan.items()}
    counts = check_training_window(store, request, have=have)
    differ = {
        day: why
        for day in request.days
        if settle is not None
        and (diff := settle(day, scan[day][1])).state is State.IN_FLIGHT
        and (why := diff.describe())
    }
    if differ:
        raise TrainingDataError(
            f"model {model.name!r} partition {ds}: training table {model.table} is still "
            "being written for "
            + "; ".join(f"{day} ({why})" for day, why in differ.items())
            + ". Train it once that run has ended, so that it trains on what Dagster records"
        )
    return request, counts


def train_partition(
    context: dg.AssetExecutionContext,
    model: Model,
    ds: str,
    launcher: TrainingLauncher,
    warehouse: WarehouseResource,
    *,
    settle: Callable[[str, Commit], Difference] | None = None,
) -> dict[str, Any]:
    """Train one partition as its own job and promote it; its materialization metadata
    (``settle``: see ``prepare``)."""
    try:
        request, counts = prepare(model, ds, warehouse, settle=settle)
        archive, requirements = load_archive(model, warehouse)
    except (
        TrainingDataError,
        ArchiveVerificationError,
        TrainerArchiveError,
        BlobStorageError,
    ) as exc:
        raise failure(exc) from None
    context.log.info(f"window {request.start_ds}..{request.end_ds}: parquet files per day {counts}")

    from zipline_dagster.training.launchers.ray_head import RayHeadError
    from zipline_dagster.training.launchers.ray_job import RayUnreachableError

    try:
        outcome = _launch(context, launcher, request, archive, requirements, label=ds)
    except TrainingJobError as exc:
        raise _job_failure(exc) from None
    except (RayUnreachableError, RayHeadError) as exc:
        raise failure(exc) from None
    attempt_id = outcome.model_dir.rstrip("/").rsplit("/", 1)[1]
    metadata = finish_partition(
        context,
        request,
        attempt_id=attempt_id,
        job_id=outcome.job_id,
        launcher=outcome.launcher,
        seconds=outcome.seconds,
        attached=outcome.attached,
    )
    if outcome.launcher == "ray":
        metadata["ray_dashboard"] = dg.MetadataValue.url(outcome.job_url or "")
    return metadata


def _launch(
    context: dg.AssetExecutionContext,
    launcher: TrainingLauncher,
    request: TrainingRequest,
    archive: bytes,
    requirements: list[str],
    *,
    label: str,
) -> Any:
    """Run the request's job to its end (``label``: the partition or range it trains)."""
    from zipline_dagster.training.launchers.ray_job import job_metadata

    model = request.model
    return launcher.runner(context.log).run(
        request,
        archive=archive,
        requirements=requirements,
        metadata=job_metadata(
            model=model.name, version=model.version, ds=label, dagster_run_id=context.run.run_id
        ),
    )


def finish_partition(
    context: dg.AssetExecutionContext,
    request: TrainingRequest,
    *,
    attempt_id: str,
    job_id: str,
    launcher: str,
    seconds: float,
    attached: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Promote a successful attempt into ``{version}/{ds}/`` (the earlier finished model
    is superseded only now, the manifest written last); the partition's metadata.

    Raises:
        dg.Failure: the attempt's artifacts do not satisfy the contract (named).
    """
    model, ds = request.model, request.ds
    artifacts = context.resources.warehouse.store(request.canonical_dir)
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
                "job_id": job_id,
                "launcher": launcher,
                "archive_uri": request.archive_uri,
                "dagster_run_id": context.run.run_id,
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
        context.log.info(f"attempt {attempt_id} had already been promoted by another run")
    if promotion.left_behind:
        context.log.warning(
            f"{model.version}/{ds} is committed, but these could not be deleted (never read; "
            f"a stale lock is broken by the next promotion): {', '.join(promotion.left_behind)}"
        )
    metadata: dict[str, Any] = {
        "version": model.version,
        "archive_uri": request.archive_uri,
        "artifact_uri": request.canonical_dir,
        "attempt": attempt_id,
        "launcher": launcher,
        "job_seconds": dg.MetadataValue.float(round(seconds, 3)),
        "reattached": attached,
        "window": f"{request.start_ds}..{request.end_ds}",
        "artifact_files": dg.MetadataValue.json([f["path"] for f in promotion.manifest["files"]]),
        **(extra or {}),
        **report_metadata(report, pr_curve_png=png),
    }
    metadata["ray_job_id" if launcher == "ray" else "job_id"] = job_id
    if promotion.superseded:
        metadata["superseded_artifacts"] = promotion.superseded
    return metadata


def train_range(
    context: dg.AssetExecutionContext,
    model: Model,
    days: list[str],
    launcher: TrainingLauncher,
    warehouse: WarehouseResource,
    *,
    settle: Callable[[str, Commit], Difference] | None = None,
) -> dg.MaterializeResult:
    """Train a run's range of partitions, each its own materialization (``settle``: see
    ``prepare``).

    On Ray (a model without Ray Train workers) the partitions train together in one job,
    one task each, as many at once as the cluster has CPUs for; otherwise one after
    another. A partition that fails (its window, its trainer, its artifacts) fails only
    itself: the others are promoted and materialized, then the step fails naming it. A
    re-execution of the run from its failure does not train again what the failed run
    trained when nothing has changed since (``reusable_partitions``).
    """

    done: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    table_store = warehouse.store(warehouse.uri)
    try:  # the training table listed once for the range
        scan = committed_scan(table_store, table_uri(warehouse.uri, model.table))
    except BlobStorageError as exc:
        raise failure(exc) from None
    ready: list[TrainingRequest] = []
    for ds in days:
        try:
            ready.append(prepare(model, ds, warehouse, scan=scan, settle=settle)[0])
        except TrainingDataError as exc:
            errors[ds] = str(exc)
    # A re-execution from failure trains only what the runs it resumes left undone.
    done.update(reusable_partitions(context, ready, warehouse))
    ready = [r for r in ready if r.ds not in done]
    together = (
        launcher.runs_ranges_in_one_job
        and model.training_conf.resource_config.workers == 0
        and len(ready) > 1
    )
    if together:
        try:
            archive, requirements = load_archive(model, warehouse)
        except (ArchiveVerificationError, TrainerArchiveError, BlobStorageError) as exc:
            raise failure(exc) from None
        done.update(
            _train_in_one_job(context, model, ready, launcher, archive, requirements, errors)
        )
    else:
        for request in ready:
            try:
                done[request.ds] = train_partition(context, model, request.ds, launcher, warehouse)
            except dg.Failure as exc:
                errors[request.ds] = exc.description or "failed"
    return record_range(
        context, days, done, errors, name=model.name, verb="trained", code_version=model.version
    )


@dataclass(frozen=True)
class RangeJob:
    """A finished (or failed) range job: its submission id and each partition's result
    line (``trainer_io.partition_results``), by ds."""

    sid: str
    results: dict[str, dict[str, Any]]
    attached: bool
    url: str | None
    error: TrainingJobError | None

    def problem(self, ds: str, *, runner: str, doing: str) -> str | None:
        """Why partition ``ds`` did not finish in the job (None: it did): no result line
        (the job ended first), or its ``runner`` (trainer, inference module) failed."""
        result = self.results.get(ds)
        if result is None:
            return f"Ray job {self.sid} ended without {doing} it: {self.error}"
        if result["exit_code"] != 0:
            return (
                f"its {runner} exited with {result['exit_code']} in Ray job {self.sid}:\n"
                + traceback_tail(result.get("tail", ""))
            )
        return None


def run_range_job(launch: Callable[[], Any]) -> RangeJob:
    """Run a range job to its end (``launch``: the runner's ``run``); a failed job still
    yields the result lines it printed, so each partition's outcome is its own.

    Raises:
        dg.Failure: Ray cannot be reached (nothing ran).
    """
    from zipline_dagster.training.launchers.ray_head import RayHeadError
    from zipline_dagster.training.launchers.ray_job import RayUnreachableError
    from zipline_dagster.training.trainer_io import partition_results

    try:
        outcome = launch()
    except TrainingJobError as exc:
        return RangeJob(exc.job_id or "", partition_results(exc.logs), False, None, exc)
    except (RayUnreachableError, RayHeadError) as exc:
        raise failure(exc) from None
    return RangeJob(
        outcome.job_id, partition_results(outcome.logs), outcome.attached, outcome.job_url, None
    )


def _train_in_one_job(
    context: dg.AssetExecutionContext,
    model: Model,
    ready: list[TrainingRequest],
    launcher: TrainingLauncher,
    archive: bytes,
    requirements: list[str],
    errors: dict[str, str],
) -> dict[str, dict[str, Any]]:
    job = build_range_request(ready)
    span = f"{ready[0].ds}_{ready[-1].ds}"
    context.log.info(
        f"training {len(ready)} partitions {ready[0].ds}..{ready[-1].ds} in one Ray job, "
        "one task each"
    )
    ran = run_range_job(lambda: _launch(context, launcher, job, archive, requirements, label=span))
    done: dict[str, dict[str, Any]] = {}
    for request in ready:
        problem = ran.problem(request.ds, runner="trainer", doing="training")
        if problem is not None:
            errors[request.ds] = problem
            continue
        try:
            md = finish_partition(
                context,
                request,
                attempt_id=ran.sid,
                job_id=ran.sid,
                launcher="ray",
                seconds=float(ran.results[request.ds]["seconds"]),
                attached=ran.attached,
                extra={"range": f"{ready[0].ds}..{ready[-1].ds}"},
            )
        except dg.Failure as exc:
            errors[request.ds] = exc.description or "failed"
            continue
        if ran.url:
            md["ray_dashboard"] = dg.MetadataValue.url(ran.url)
        done[request.ds] = md
    return done
