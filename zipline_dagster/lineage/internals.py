"""What this project uses of Dagster that has no public form, in one place.

Everything here reaches into ``dagster._core`` or ``dagster._daemon``: a Dagster upgrade
may move it. ``tests/lineage/test_internals.py`` imports every name this module uses and
fails when one moves; nothing else in the project imports a private Dagster module.

* submitting an asset backfill from a plan to an instance without a webserver
  (``launch_backfill``): Dagster's public API launches backfills only through the UI or
  GraphQL against a running webserver (``lineage.deployment``, ``backfill --url``);
* running a plan's runs in-process with a range run's tags (``execute_plan_in_process``,
  for ``make demo`` and the benchmarks);
* running the backfill and run-queue daemons' iterations in-process
  (``drive_backfill``, for ``zipline-dagster backfill --wait`` without a daemon), and
  telling whether a daemon is heartbeating (``daemon_running``) and which assets a
  backfill in progress targets (``backfilling``);
* ``dagster-daemon run`` whose backfill daemon passes every few seconds instead of
  Dagster's fixed 30 (``run_daemon``: a module constant, no setting; the topology's);
* the run tags of a range run, of a backfill's runs (``failed_runs``) and of a
  re-execution from failure, the error of an unset
  ``DAGSTER_HOME``, a check evaluation's target materialization, the asset graph type.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    ASSET_RESUME_RETRY_TAG,
    BACKFILL_ID_TAG,
    RESUME_RETRY_TAG,
)

from zipline_dagster.errors import step_error
from zipline_dagster.lineage.backfill import (
    Plan,
    RunFailed,
    contiguous_runs,
    plan_done,
    span_text,
)
from zipline_dagster.lineage.freshness import BackfillError

__all__ = [
    "ASSET_PARTITION_RANGE_END_TAG",
    "ASSET_PARTITION_RANGE_START_TAG",
    "ASSET_RESUME_RETRY_TAG",
    "RESUME_RETRY_TAG",
    "AssetGraph",
    "backfilling",
    "check_target",
    "daemon_running",
    "drive_backfill",
    "execute_plan_in_process",
    "failed_runs",
    "launch_backfill",
    "run_daemon",
]

#: a step's error when the run was interrupted (Ctrl-C, SIGTERM)
_INTERRUPTED = ("KeyboardInterrupt", "DagsterExecutionInterruptedError")


def check_target(record: dg.EventLogRecord) -> Any:
    """The target of a check evaluation logged outside the check's own step: the
    materialization ``record`` (Dagster has no public constructor for it)."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
    )


def launch_backfill(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    plan: Plan,
    *,
    title: str,
    also: Sequence[dg.AssetKey] = (),
) -> str:
    """Submit the plan as a Dagster asset backfill (the daemon runs it; visible in the UI),
    with the unpartitioned assets ``also``, run once their parents in it are done. On a
    deployment with a webserver, ``lineage.deployment`` does the same through GraphQL."""
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
    from dagster._core.definitions.events import AssetKeyPartitionKey
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id

    graph = defs.resolve_asset_graph()
    asset_partitions = {AssetKeyPartitionKey(key, p) for key, parts in plan.steps for p in parts}
    asset_partitions |= {AssetKeyPartitionKey(key, None) for key in also}
    subset = AssetGraphSubset.from_asset_partition_set(asset_partitions, graph)
    backfill_id = make_new_backfill_id()
    backfill = PartitionBackfill.from_asset_graph_subset(
        backfill_id=backfill_id,
        backfill_timestamp=time.time(),
        tags={"zipline/backfill": title},
        dynamic_partitions_store=instance,
        asset_graph_subset=subset,
        title=title,
        description=plan.describe(),
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill_id


def execute_plan_in_process(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    plan: Plan,
    *,
    log=print,  # type: ignore[no-untyped-def]
    one_at_a_time: bool = False,
) -> list[dg.ExecuteInProcessResult]:
    """Run the plan here, upstream first, in the runs a Dagster backfill would launch:
    each asset's backfill policy sets how many partitions one run covers (a Spark
    producer's whole range in one run; up to 30 model partitions per run, which train
    together in one Ray job). ``one_at_a_time`` runs every partition alone instead (the
    benchmarks' baseline).
    """
    graph = defs.resolve_asset_graph()
    job = defs.resolve_implicit_global_asset_job_def()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    results = []
    for key, parts in plan.steps:
        policy = graph.get(key).backfill_policy
        size = 1
        if policy is not None and not one_at_a_time:
            size = policy.max_partitions_per_run or len(parts)
        for batch in contiguous_runs([parts], size):
            log(f"materializing {key.to_user_string()} {span_text(batch)}")
            tags = (
                {"dagster/partition": batch[0]}
                if len(batch) == 1
                else {
                    ASSET_PARTITION_RANGE_START_TAG: batch[0],
                    ASSET_PARTITION_RANGE_END_TAG: batch[-1],
                }
            )
            result = job.execute_in_process(
                run_config=quiet,
                instance=instance,
                asset_selection=[key],
                tags=tags,
                raise_on_error=False,
            )
            results.append(result)
            if not result.success:
                failures = result.get_step_failure_events()
                error = failures[0].step_failure_data.error if failures else None
                if error is not None and error.cls_name in _INTERRUPTED:  # Ctrl-C
                    raise KeyboardInterrupt(f"{key.to_user_string()} {span_text(batch)}")
                text = step_error(error) if error is not None else "see the run log"
                raise RunFailed(
                    f"{key.to_user_string()} {span_text(batch)} failed: {text} (run "
                    f"{result.run_id}, its whole log in the Dagster UI)"
                )
    return results


def daemon_running(instance: dg.DagsterInstance) -> bool:
    """True when a dagster-daemon (e.g. the one `dagster dev` starts) is heartbeating."""
    from dagster._daemon.controller import all_daemons_live

    try:
        return bool(all_daemons_live(instance, heartbeat_tolerance_seconds=60))
    except Exception:
        return False


def run_daemon(args: Sequence[str], *, interval_s: int) -> None:
    """``dagster-daemon`` with ``args`` (``run -w workspace.yaml``), its backfill and
    automation daemons passing every ``interval_s`` seconds: Dagster's 30 is a constant of
    ``dagster._daemon.controller`` that each pass reads, with no instance setting. The run
    queue's pass is the instance's own ``dequeue_interval_seconds``."""
    import sys

    from dagster._daemon import controller
    from dagster._daemon.cli import main

    if not 1 <= interval_s <= 30:
        raise ValueError(f"interval_s={interval_s} is not accepted: 1..30 seconds")
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = interval_s
    sys.argv = ["dagster-daemon", *args]
    main()


def backfilling(instance: dg.DagsterInstance) -> dict[dg.AssetKey, str]:
    """Each asset a backfill still in progress targets, with that backfill's id."""
    from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus

    requested = BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED])
    return {
        key: backfill.backfill_id
        for backfill in instance.get_backfills(filters=requested)
        for key in backfill.asset_selection or ()
    }


def drive_backfill(
    instance: dg.DagsterInstance,
    backfill_id: str,
    *,
    workspace_file: str,
    targets: set[tuple[dg.AssetKey, str | None]] | None = None,
    timeout_s: float = 3600,
    poll_s: float = 1.0,
    log=print,  # type: ignore[no-untyped-def]
) -> str:
    """Run the daemon's backfill pass (for this backfill) and run-queue pass here until
    the backfill ends.

    What ``dagster-daemon`` does every 30 s, done every ``poll_s``: the runs are launched
    by the instance's run launcher exactly as the daemon would launch them. While a
    daemon heartbeats for the instance, it runs the backfill and this only follows it
    (one daemon per instance: a second driver would race it); if it stops, this takes
    over, from the code locations ``workspace_file`` names. With its ``targets`` (each
    asset partition it holds), a backfill whose every target a run of it has
    materialized, with none of its runs still going (a failed one retried, say), has
    ended: the daemon marks it so only at its next pass, up to 30 s later.
    """
    import contextlib
    import logging
    from pathlib import Path

    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.backfill import execute_backfill_jobs
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    logger = logging.getLogger("zipline_dagster.lineage.backfill")
    queue = QueuedRunCoordinatorDaemon(interval_seconds=poll_s)
    deadline = time.monotonic() + timeout_s
    last, following, ctx = "", None, None
    made = _Materialized(instance)
    with contextlib.ExitStack() as stack:
        while True:
            daemon = daemon_running(instance)
            if daemon != following:
                following = daemon
                log(
                    "a dagster-daemon runs this instance's backfills: following it"
                    if daemon
                    else "running the backfill here, as the daemon would"
                )
            if not daemon:
                if ctx is None:
                    if not Path(workspace_file).is_file():
                        raise BackfillError(
                            f"backfill {backfill_id}: no daemon runs it, and the workspace "
                            f"{workspace_file} to run it from is not a file"
                        )
                    target = WorkspaceFileTarget(paths=[workspace_file])
                    ctx = stack.enter_context(WorkspaceProcessContext(instance, target))
                # this backfill only: the daemon's own pass runs every requested one, and
                # one left requested on the instance (launched without --wait, say) is
                # not this command's to run
                mine = instance.get_backfill(backfill_id)
                for _ in execute_backfill_jobs(ctx, logger, [mine] if mine else []):
                    pass
                for _ in queue.run_iteration(ctx):
                    pass
            backfill = instance.get_backfill(backfill_id)
            if backfill is None:
                raise BackfillError(f"backfill {backfill_id} disappeared")
            runs = instance.get_run_records(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
            summary, states = _progress(backfill, runs)
            if summary != last:
                log(summary)
                last = summary
            if backfill.status != BulkActionStatus.REQUESTED:
                return str(backfill.status.value)
            if plan_done(targets, states, functools.partial(made.by, runs)):
                log("COMPLETED_SUCCESS: every partition materialized")
                return "COMPLETED_SUCCESS"
            if time.monotonic() > deadline:
                raise BackfillError(f"backfill {backfill_id} still running after {timeout_s:.0f}s")
            time.sleep(poll_s)


def _progress(backfill: Any, runs: Sequence[Any]) -> tuple[str, list[str]]:
    """A backfill's progress line (its status, its runs by status, what the running
    ones materialize) and its runs' statuses."""
    states = sorted(str(r.dagster_run.status.value) for r in runs)
    summary = f"{backfill.status.value}: {len(runs)} runs " + ", ".join(
        f"{states.count(s)} {s.lower()}" for s in sorted(set(states))
    )
    running = [_what(r.dagster_run) for r in runs if r.dagster_run.status.value == "STARTED"]
    summary += f" ({'; '.join(running)})" if running else ""
    return summary.rstrip(), states


class _Materialized:
    """The asset partitions a backfill's runs materialized, each run's events read once."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance
        self.made: set[tuple[dg.AssetKey | None, str | None]] = set()
        self.read: set[str] = set()

    def by(self, runs: Sequence[Any]) -> set[tuple[dg.AssetKey | None, str | None]]:
        for run_id in {r.dagster_run.run_id for r in runs} - self.read:
            self.read.add(run_id)
            self.made.update(
                (event.dagster_event.asset_key, event.dagster_event.partition)
                for event in self.instance.all_logs(
                    run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
                )
                if event.dagster_event is not None
            )
        return self.made


def _what(run: dg.DagsterRun) -> str:
    """What a run materializes: its assets and its partition or range."""
    tags = run.tags
    span = tags.get("dagster/partition") or (
        f"{tags[ASSET_PARTITION_RANGE_START_TAG]}..{tags[ASSET_PARTITION_RANGE_END_TAG]}"
        if ASSET_PARTITION_RANGE_START_TAG in tags
        else ""
    )
    keys = ", ".join(sorted(k.to_user_string() for k in run.asset_selection or ()))
    return f"{keys} {span}".strip()


def failed_runs(instance: dg.DagsterInstance, backfill_id: str) -> list[str]:
    """Each failed run of the backfill, with its failed steps' errors (first lines)."""
    failed = dg.RunsFilter(
        tags={BACKFILL_ID_TAG: backfill_id}, statuses=[dg.DagsterRunStatus.FAILURE]
    )
    lines = []
    for record in instance.get_run_records(failed):
        run_id = record.dagster_run.run_id
        why = [
            f"{event.step_key}: {step_error(event.dagster_event.step_failure_data.error)}"
            for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
            if event.dagster_event and event.dagster_event.step_failure_data.error
        ]
        lines.append(f"run {run_id} failed: " + ("; ".join(why) or "see the run in the UI"))
    return lines
