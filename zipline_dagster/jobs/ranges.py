"""The one range runner: how a step runs its partitions, model partitions or scores days,
as jobs on the cluster.

A step is handed one partition or a backfill run's range. For either, ``run_days``:

1. prepares each day (``DayWork.prepare``: its inputs checked, its request built); a day
   that cannot run fails alone;
2. leaves out what the run it re-executes already finished (``DayWork.reuse``);
3. loads the trainer archive once;
4. runs the days in one job, one Ray task each (``zipline_runtime.driver``), when the launcher
   and the work allow it, else one job after another;
5. finishes each day that ran (``DayWork.finish``: promote a model attempt, commit a
   scores file);
6. records each finished day as its own materialization (``record_range``); when any
   failed, the step fails naming each, after the others are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg
from zipline_runtime.contract import PartitionResult, partition_results
from zipline_runtime.driver import done_marker

from zipline_dagster.declarations.model import Model
from zipline_dagster.declarations.versions import model_code_version
from zipline_dagster.errors import failure
from zipline_dagster.jobs.archive import (
    ArchiveVerificationError,
    TrainerArchiveError,
    load_verified_archive,
)
from zipline_dagster.jobs.cost import Cost, Usage
from zipline_dagster.jobs.launchers.ray_client import RayUnreachableError, job_metadata
from zipline_dagster.jobs.launchers.ray_head import RayHeadError
from zipline_dagster.jobs.request import (
    JobOutcome,
    JobRequest,
    TrainingJobError,
    build_range_request,
    read_install_requires,
    traceback_tail,
)
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.jobs.runtime import RuntimeShipError, ship_runtime
from zipline_dagster.lineage.partitions import record_range
from zipline_dagster.packaging import RuntimeArchive
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.resources import WarehouseResource


@dataclass(frozen=True)
class Ran:
    """How a day's job ran."""

    #: the job's id, which is the day's attempt too
    job_id: str
    #: the job's page in the Ray dashboard (None: no dashboard)
    url: str | None
    #: whether the step re-attached to a job already running
    attached: bool
    seconds: float
    #: ``ray`` or ``local``
    launcher: str
    #: ``first..last`` when the job ran several days, one task each
    span: str | None = None
    #: what the day cost (its share of the job, its own run)
    cost: Cost | None = None


class DayWork(Protocol):
    """What one kind of partition does at each stage of ``run_days``."""

    model: Model
    #: named in the step's messages: the model, or the scores table
    name: str
    #: what finishing a day is ("trained"), doing it ("training"), and what runs it
    #: ("trainer"), for the messages
    verb: str
    doing: str
    runner: str
    #: the job key's prefix of a range (``build_range_request``); "" for the default
    key_prefix: str
    #: whether its days may run together in one job
    together: bool

    def prepare(self, ds: str) -> JobRequest:
        """Day ``ds``'s request. Raises ``dg.Failure`` naming why the day cannot run."""
        ...

    def reuse(self, ready: list[JobRequest]) -> dict[str, dict[str, Any]]:
        """{ds: metadata} of the days the run this one re-executes finished already."""
        ...

    def begin(self, request: JobRequest) -> None:
        """Before the day's job runs."""
        ...

    def finish(self, request: JobRequest, ran: Ran) -> dict[str, Any]:
        """The day's job succeeded: make its output the partition; its metadata.
        Raises ``dg.Failure`` naming why it could not (the partition is left as it was)."""
        ...


@dataclass(frozen=True)
class JobCode:
    """What a model's jobs run: its trainer archive, the archive's ``install_requires``
    and the runtime build beside it."""

    archive: bytes
    requirements: list[str]
    runtime: RuntimeArchive


def load_archive(model: Model, warehouse: WarehouseResource, version: str | None = None) -> JobCode:
    """The model's verified trainer archive (of ``version``, default the model's), its
    ``install_requires``, and its runtime build (``jobs.runtime.ship_runtime``).

    Raises:
        dg.Failure: the archive or the runtime is missing, does not verify or cannot be
            read, or the runtime speaks a protocol this platform does not (named).
    """
    options = warehouse.storage_options()
    try:
        archive_uri, archive = load_verified_archive(
            base=model.model_artifact_base_uri,
            model_name=model.name,
            version=version or model.version,
            options=options,
        )
        runtime = ship_runtime(model.model_artifact_base_uri, model.runtime, options=options)
        return JobCode(archive, read_install_requires(archive, uri=archive_uri), runtime.archive)
    except (
        ArchiveVerificationError,
        TrainerArchiveError,
        BlobStorageError,
        RuntimeShipError,
    ) as exc:
        raise failure(exc) from None


def run_days(
    context: dg.AssetExecutionContext,
    work: DayWork,
    days: list[str],
    launcher: JobLauncher,
    warehouse: WarehouseResource,
) -> dg.MaterializeResult:
    """Run ``days`` of ``work`` to their materializations (see the module's docstring).

    Raises:
        dg.Failure: a single day failed (its own failure), or some days of a range did
            (naming each, after the others are recorded), or nothing could run (the
            archive, or Ray unreachable).
    """
    done, errors = run_jobs(context, work, days, launcher, warehouse)
    if len(days) == 1:
        if errors:
            raise errors[days[0]]
        return dg.MaterializeResult(metadata=done[days[0]])
    return record_range(
        context,
        days,
        done,
        {ds: exc.description or "failed" for ds, exc in errors.items()},
        name=work.name,
        verb=work.verb,
        code_version=model_code_version(work.model),
    )


def run_jobs(
    context: dg.AssetExecutionContext,
    work: DayWork,
    days: list[str],
    launcher: JobLauncher,
    warehouse: WarehouseResource,
) -> tuple[dict[str, dict[str, Any]], dict[str, dg.Failure]]:
    """Stages 1 to 5 of ``run_days``: each day prepared, run and finished, nothing
    recorded; {ds: its metadata} of the days finished and {ds: its failure} of the others.

    Raises:
        dg.Failure: nothing could run (the archive, or Ray unreachable).
    """
    done: dict[str, dict[str, Any]] = {}
    errors: dict[str, dg.Failure] = {}
    ready: list[JobRequest] = []
    for ds in days:
        try:
            ready.append(work.prepare(ds))
        except dg.Failure as exc:
            errors[ds] = exc
    done.update(work.reuse(ready))
    ready = [r for r in ready if r.ds not in done]
    # a day runs its own trainer version's archive (scoring by a champion of another)
    for version in sorted({r.version for r in ready}):
        same = [r for r in ready if r.version == version]
        _launch_ready(context, work, same, launcher, warehouse, done, errors)
    return done, errors


def _launch_ready(
    context: dg.AssetExecutionContext,
    work: DayWork,
    ready: list[JobRequest],
    launcher: JobLauncher,
    warehouse: WarehouseResource,
    done: dict[str, dict[str, Any]],
    errors: dict[str, dg.Failure],
) -> None:
    """Run the ``ready`` days' jobs, all of one trainer version (a range in one job where
    the launcher can), adding each day's metadata to ``done`` or its failure to
    ``errors``."""
    code = load_archive(work.model, warehouse, ready[0].version)
    try:  # the embedded Ray head starts here when nothing else is configured
        runner = launcher.runner(context.log, warehouse.store)
    except (RayUnreachableError, RayHeadError) as exc:
        raise failure(exc) from None

    def launch(request: JobRequest, label: str) -> JobOutcome:
        return runner.run(
            request,
            archive=code.archive,
            runtime=code.runtime,
            requirements=code.requirements,
            metadata=job_metadata(
                model=work.model.name,
                version=request.version,
                ds=label,
                dagster_run_id=context.run.run_id,
            ),
        )

    if launcher.runs_ranges_in_one_job and work.together and len(ready) > 1:
        _in_one_job(context, work, ready, launch, done, errors, warehouse)
        return
    for request in ready:
        try:
            done[request.ds] = _alone(context, work, request, launch, warehouse)
        except dg.Failure as exc:
            errors[request.ds] = exc


def _alone(
    context: dg.AssetExecutionContext,
    work: DayWork,
    request: JobRequest,
    launch: Callable[[JobRequest, str], JobOutcome],
    warehouse: WarehouseResource,
) -> dict[str, Any]:
    """One day in a job of its own. A job that did not succeed, but whose driver's end
    marker says the day's run did (the process failed on its way out, or its node was
    lost after the marker was written), is finished from storage, as a range's day is."""
    work.begin(request)
    try:
        outcome = launch(request, request.ds)
        usage = Usage.of(partition_results(outcome.logs).get(request.ds)) or outcome.usage
        ran = Ran(
            outcome.job_id,
            outcome.job_url,
            outcome.attached,
            outcome.seconds,
            outcome.launcher,
            cost=Cost(outcome.seconds, 1, usage),
        )
    except TrainingJobError as exc:
        sid = exc.job_id or ""
        result = stored_results(warehouse, request.marker_dir, sid).get(request.ds)
        if result is None or result["exit_code"] != 0:
            raise failure(
                exc,
                job_id=sid,
                trainer_log_tail=dg.MetadataValue.md(f"```\n{exc.logs_tail}\n```"),
            ) from None
        context.log.warning(
            f"{request.ds}: {str(exc).splitlines()[0]}; but its {work.runner} had finished "
            f"(exit code 0 in the job's end marker on storage), so the day is {work.verb} "
            "from what it wrote"
        )
        seconds = float(result["seconds"])
        ran = Ran(sid, None, False, seconds, "ray", cost=Cost(seconds, 1, Usage.of(result)))
    except (RayUnreachableError, RayHeadError) as exc:
        raise failure(exc) from None
    return work.finish(request, ran)


def _in_one_job(
    context: dg.AssetExecutionContext,
    work: DayWork,
    ready: list[JobRequest],
    launch: Callable[[JobRequest, str], JobOutcome],
    done: dict[str, dict[str, Any]],
    errors: dict[str, dg.Failure],
    warehouse: WarehouseResource,
) -> None:
    """The days in one job, one task each: a day without a result line (the job ended
    first) or whose task failed fails alone; a failed job still yields the result lines
    it wrote."""
    first, last = ready[0].ds, ready[-1].ds
    span = f"{first}..{last}"
    context.log.info(
        f"{work.doing} {len(ready)} partitions {span} of {work.name} in one Ray job, one task each"
    )
    for request in ready:
        work.begin(request)
    job = build_range_request(ready, key_prefix=work.key_prefix)
    error: TrainingJobError | None = None
    started = time.monotonic()
    try:
        outcome = launch(job, f"{first}_{last}")
        sid, logs, url, attached = outcome.job_id, outcome.logs, outcome.job_url, outcome.attached
        job_s = outcome.seconds
    except TrainingJobError as exc:
        sid, logs, url, attached, error = exc.job_id or "", exc.logs, None, False, exc
        job_s = time.monotonic() - started
    except (RayUnreachableError, RayHeadError) as exc:
        raise failure(exc) from None
    # what the driver left on storage is the truth; the log fills in the rest
    results = {**partition_results(logs), **stored_results(warehouse, job.marker_dir, sid)}
    for request in ready:
        result = results.get(request.ds)
        if result is None:
            errors[request.ds] = dg.Failure(f"Ray job {sid} ended without {work.doing} it: {error}")
        elif result["exit_code"] != 0:
            errors[request.ds] = dg.Failure(
                f"its {work.runner} exited with {result['exit_code']} in Ray job {sid}:\n"
                + traceback_tail(result.get("tail", ""))
            )
        else:
            cost = Cost(job_s, len(ready), Usage.of(result))
            ran = Ran(sid, url, attached, float(result["seconds"]), "ray", span, cost)
            try:
                done[request.ds] = work.finish(request, ran)
            except dg.Failure as exc:
                errors[request.ds] = exc


def stored_results(
    warehouse: WarehouseResource, marker_dir: str, sid: str
) -> dict[str, PartitionResult]:
    """The result lines the driver of job ``sid`` left in its end marker (in
    ``marker_dir``, on storage: ``zipline_runtime.driver``), by ds; none when it wrote none (it
    died first, or no job was submitted)."""
    if not sid:
        return {}
    marker = done_marker(marker_dir, sid)
    try:
        return partition_results(warehouse.store(marker).read_bytes(marker).decode())
    except (BlobStorageError, UnicodeDecodeError):
        return {}
