"""Freshness through lineage: what must be (re)computed before a model range trains.

A partition is *fresh* when it has been materialized with the asset's current code
version and after every partition it reads (transitively fresh too). Otherwise it is
missing or stale, and a backfill of a model range includes it, upstream first. A fresh
partition is skipped, so re-running a backfill of a fresh range does nothing.

An external table's partition counts as updated after a materialization only when its
observed data version changed since then: observing it again unchanged (the UI's
"Observe sources", a schedule) retrains nothing, as Dagster's own automation treats it.
"""

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.events import DagsterEventType

from zipline_dagster.storage.tables import WRITE_ID, partition_writes, unrecorded_write

CODE_VERSION_TAG = "dagster/code_version"
DATA_VERSION_TAG = "dagster/data_version"


class BackfillError(ValueError):
    """The backfill request is invalid (unknown asset, partition out of range ...)."""


@dataclass
class Plan:
    """Asset partitions to materialize, in dependency order, and why each is included."""

    steps: list[tuple[dg.AssetKey, list[str]]] = field(default_factory=list)
    reasons: dict[tuple[dg.AssetKey, str], str] = field(default_factory=dict)
    fresh: list[tuple[dg.AssetKey, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        if self.empty:
            return "nothing to do: every requested partition is fresh"
        lines = []
        for key, parts in self.steps:
            full = {self.reasons[(key, p)] for p in parts}
            # one reason is shown whole; several are summed up by kind
            why = sorted(full) if len(full) == 1 else sorted({r.split(":")[0] for r in full})
            lines.append(f"  {key.to_user_string()}: {_span(parts)} ({', '.join(why)})")
        return "\n".join(lines)


def _span(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{len(parts)} partitions {parts[0]}..{parts[-1]}"


class FreshnessResolver:
    """Per-partition freshness from the instance's materialization records."""

    def __init__(self, instance: dg.DagsterInstance, graph: AssetGraph) -> None:
        self.instance = instance
        self.graph = graph
        self._ids: dict[dg.AssetKey, dict[str, int]] = {}
        self._versions: dict[dg.AssetKey, dict[str, str]] = {}
        self._artifacts: dict[dg.AssetKey, dict[str, str]] = {}
        self._attempts: dict[dg.AssetKey, dict[str, str]] = {}
        #: a table partition's recorded folder and write, and each table's writes on storage
        self._writes: dict[dg.AssetKey, dict[str, tuple[str, str]]] = {}
        self._stored: dict[str, dict[str, str | None]] = {}
        self._memo: dict[tuple[dg.AssetKey, str], str] = {}
        self._observed: dict[dg.AssetKey, dict[str, str | None]] = {}

    def latest_ids(self, key: dg.AssetKey) -> dict[str, int]:
        """{partition: storage id of its latest materialization (observation, for a
        source)} of ``key``."""
        if key not in self._ids:
            node = self.graph.get(key)
            event = (
                DagsterEventType.ASSET_MATERIALIZATION
                if node.is_materializable
                else DagsterEventType.ASSET_OBSERVATION
            )
            self._ids[key] = dict(
                self.instance.event_log_storage.get_latest_storage_id_by_partition(key, event)
            )
        return self._ids[key]

    def _data_versions(
        self, key: dg.AssetKey, partitions: list[str], before: int | None = None
    ) -> dict[str, str | None]:
        """{partition: data version of its latest observation} of observed ``key`` (only
        observations with a storage id below ``before``, when given)."""
        tags = self.instance.event_log_storage.get_latest_tags_by_partition(
            key,
            DagsterEventType.ASSET_OBSERVATION,
            [DATA_VERSION_TAG],
            asset_partitions=partitions,
            before_cursor=before,
        )
        return {p: tags.get(p, {}).get(DATA_VERSION_TAG) for p in partitions}

    def observed_changed_since(self, key: dg.AssetKey, partitions: list[str], since: int) -> str:
        """The first of observed ``key``'s ``partitions`` whose data version differs from
        the one it had at storage id ``since`` ("" when none did). A partition with no
        observation before then counts as changed: nothing says what was read."""
        if key not in self._observed:
            self._observed[key] = {}
        latest = self._observed[key]
        todo = [p for p in partitions if p not in latest]
        if todo:
            latest.update(self._data_versions(key, todo))
        then = self._data_versions(key, partitions, before=since)
        for p in partitions:
            if then[p] is None or then[p] != latest[p]:
                return p
        return ""

    def _code_versions(self, key: dg.AssetKey) -> dict[str, str]:
        if key not in self._versions:
            ids = self.latest_ids(key)
            versions: dict[str, str] = {}
            artifacts: dict[str, str] = {}
            attempts: dict[str, str] = {}
            writes: dict[str, tuple[str, str]] = {}
            if ids:
                records = self.instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=key, storage_ids=list(ids.values())),
                    limit=len(ids),
                ).records
                for r in records:
                    mat = r.asset_materialization
                    if mat is not None and mat.partition is not None:
                        versions[mat.partition] = (mat.tags or {}).get(CODE_VERSION_TAG, "")
                        uri = mat.metadata.get("artifact_uri")
                        if uri is not None:
                            artifacts[mat.partition] = str(uri.value)
                        attempt = mat.metadata.get("attempt")
                        if attempt is not None:
                            attempts[mat.partition] = str(attempt.value)
                        path, write = mat.metadata.get("path"), mat.metadata.get(WRITE_ID)
                        if path is not None and write is not None:
                            writes[mat.partition] = (str(path.value), str(write.value))
            self._versions[key] = versions
            self._artifacts[key] = artifacts
            self._attempts[key] = attempts
            self._writes[key] = writes
        return self._versions[key]

    def model_on_storage(self, key: dg.AssetKey, partition: str) -> str | None:
        """Why storage does not hold the finished model Dagster recorded for a model
        partition (no manifest, a file it lists gone, or another attempt than the one
        recorded), or None when it does."""
        from zipline_dagster.storage.artifacts import (
            committed_manifest,
            unrecorded_attempt,
        )
        from zipline_dagster.storage.blobs import BlobStorageError, blob_store
        from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri

        self._code_versions(key)
        uri = self._artifacts.get(key, {}).get(partition)
        if uri is None:
            return None  # not a model partition
        try:
            manifest = committed_manifest(blob_store(uri), uri, checksums=False)
        except BlobStorageError as exc:
            return f"its artifacts at {uri} cannot be read ({exc})"
        if manifest is None:
            return (
                "its finished model is missing on storage "
                f"(no complete {join_uri(uri, MANIFEST_NAME)})"
            )
        return unrecorded_attempt(manifest, self._attempts[key].get(partition))

    def table_on_storage(self, key: dg.AssetKey, partition: str) -> str | None:
        """Why storage does not hold the table partition Dagster recorded (not committed,
        or committed by another write than the recorded one: a run stopped between
        committing it and recording it), or None when it does, or nothing says (a
        materialization that names no write)."""
        from zipline_dagster.storage.blobs import BlobStorageError, blob_store

        self._code_versions(key)
        recorded = self._writes.get(key, {}).get(partition)
        if recorded is None:
            return None
        folder, write = recorded
        root = folder.rstrip("/").rsplit("/", 1)[0]  # the table: {root}/ds=YYYY-MM-DD
        if root not in self._stored:
            try:
                self._stored[root] = partition_writes(blob_store(root), root)
            except BlobStorageError as exc:
                return f"its table at {root} cannot be listed ({exc})"
        stored = self._stored[root]
        if partition not in stored:
            return f"it is not committed on storage (no complete {folder})"
        return unrecorded_write(stored[partition], write)

    def parents(self, key: dg.AssetKey, partition: str) -> list[tuple[dg.AssetKey, str]]:
        """The upstream partitions ``partition`` of ``key`` reads (existing keys only)."""
        out: list[tuple[dg.AssetKey, str]] = []
        node = self.graph.get(key)
        for parent in sorted(node.parent_keys):
            pnode = self.graph.get(parent)
            pdef = pnode.partitions_def
            if pdef is None:
                out.append((parent, ""))
                continue
            mapping = self.graph.get_partition_mapping(key, parent)
            if isinstance(mapping, dg.TimeWindowPartitionMapping):
                day = dt.date.fromisoformat(partition)
                days = [
                    (day + dt.timedelta(days=o)).isoformat()
                    for o in range(mapping.start_offset, mapping.end_offset + 1)
                ]
            elif isinstance(mapping, dg.IdentityPartitionMapping) or mapping is None:
                days = [partition]
            else:
                raise BackfillError(
                    f"unsupported partition mapping {type(mapping).__name__} from {key} to {parent}"
                )
            out.extend((parent, d) for d in days if pdef.has_partition_key(d))
        return out

    def status(self, key: dg.AssetKey, partition: str) -> str:
        """'fresh', 'missing', or 'stale: <why>'."""
        memo_key = (key, partition)
        if memo_key in self._memo:
            return self._memo[memo_key]
        node = self.graph.get(key)
        ids = self.latest_ids(key)
        if not node.is_materializable:
            result = "fresh"  # observed from outside; the run-time checks see what exists
        elif partition not in ids:
            result = "missing"
        else:
            result = "fresh"
            if node.code_version and self._code_versions(key).get(partition) != node.code_version:
                result = f"stale: code version changed to {node.code_version}"
            elif off_storage := (
                self.model_on_storage(key, partition) or self.table_on_storage(key, partition)
            ):  # read from storage only when Dagster's own record does not already say
                result = f"stale: {off_storage}"
            else:
                observed: dict[dg.AssetKey, list[str]] = {}
                for pkey, ppart in self.parents(key, partition):
                    pstatus = self.status(pkey, ppart)
                    if pstatus != "fresh":
                        result = f"stale: upstream {pkey.to_user_string()} {ppart} is {pstatus.split(':')[0]}"
                        break
                    if self.latest_ids(pkey).get(ppart, 0) <= ids[partition]:
                        continue
                    if not self.graph.get(pkey).is_materializable:
                        observed.setdefault(pkey, []).append(ppart)  # its data version says
                        continue
                    result = f"stale: upstream {pkey.to_user_string()} {ppart} was updated after it"
                    break
                for pkey, parts in observed.items() if result == "fresh" else ():
                    changed = self.observed_changed_since(pkey, parts, ids[partition])
                    if changed:
                        result = (
                            f"stale: upstream {pkey.to_user_string()} {changed} was updated "
                            "after it (its observed data version changed)"
                        )
                        break
        self._memo[memo_key] = result
        return result


def plan_backfill(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    target: dg.AssetKey,
    partitions: Iterable[str],
) -> Plan:
    graph = defs.resolve_asset_graph()
    if not graph.has(target) or not graph.get(target).is_materializable:
        known = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        raise BackfillError(
            f"no asset {target.to_user_string()!r} in the code location; known: {', '.join(known)}"
        )
    resolver = FreshnessResolver(instance, graph)
    plan = Plan()
    needed: dict[dg.AssetKey, set[str]] = {}
    stack = [(target, p) for p in partitions]
    seen: set[tuple[dg.AssetKey, str]] = set()
    while stack:
        key, part = stack.pop()
        if (key, part) in seen:
            continue
        seen.add((key, part))
        status = resolver.status(key, part)
        if status == "fresh":
            plan.fresh.append((key, part))
            continue
        needed.setdefault(key, set()).add(part)
        plan.reasons[(key, part)] = status
        stack.extend(p for p in resolver.parents(key, part) if graph.get(p[0]).is_materializable)
    for key in graph.toposorted_asset_keys:
        if key in needed:
            plan.steps.append((key, sorted(needed[key])))
    return plan


def _checked_graph(defs: dg.Definitions, target: dg.AssetKey) -> AssetGraph:
    graph = defs.resolve_asset_graph()
    if not graph.has(target) or not graph.get(target).is_materializable:
        known = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        raise BackfillError(
            f"no asset {target.to_user_string()!r} in the code location; known: {', '.join(known)}"
        )
    return graph


def model_partitions(defs: dg.Definitions, key: dg.AssetKey, start: str, end: str) -> list[str]:
    graph = _checked_graph(defs, key)
    pdef = graph.get(key).partitions_def
    if pdef is None:
        raise BackfillError(f"{key.to_user_string()} is not partitioned")
    for name, value in (("--start-ds", start), ("--end-ds", end)):
        if not pdef.has_partition_key(value):
            first = pdef.get_first_partition_key()
            last = pdef.get_last_partition_key()
            since = graph.get(key).metadata.get("zipline/start_partition")
            why = (
                f" (its training query's start_partition is {since}: a partition whose window "
                "reaches before it is not trainable)"
                if since
                else ""
            )
            raise BackfillError(
                f"{name}={value!r} is not a partition of {key.to_user_string()}; accepted: days "
                f"{first}..{last}{why}"
            )
    if start > end:
        raise BackfillError(f"--start-ds={start} is after --end-ds={end}")
    return list(pdef.get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))


def launch_backfill(
    defs: dg.Definitions, instance: dg.DagsterInstance, plan: Plan, *, title: str
) -> str:
    """Submit the plan as a Dagster asset backfill (the daemon runs it; visible in the UI)."""
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
    from dagster._core.definitions.events import AssetKeyPartitionKey
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id

    graph = defs.resolve_asset_graph()
    asset_partitions = {AssetKeyPartitionKey(key, p) for key, parts in plan.steps for p in parts}
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
    from dagster._core.storage.tags import (
        ASSET_PARTITION_RANGE_END_TAG,
        ASSET_PARTITION_RANGE_START_TAG,
    )

    graph = defs.resolve_asset_graph()
    job = defs.resolve_implicit_global_asset_job_def()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    results = []
    for key, parts in plan.steps:
        policy = graph.get(key).backfill_policy
        size = 1
        if policy is not None and not one_at_a_time:
            size = policy.max_partitions_per_run or len(parts)
        for batch in _contiguous([parts], size):
            log(f"materializing {key.to_user_string()} {_span(batch)}")
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
                text = (
                    failures[0].step_failure_data.error.message
                    if failures and failures[0].step_failure_data.error
                    else "see the run log"
                )
                raise RuntimeError(f"{key.to_user_string()} {_span(batch)} failed: {text}")
    return results


def _contiguous(batches: list[list[str]], size: int) -> list[list[str]]:
    """Split each batch where days are not consecutive (a range run covers a span) and
    into runs of at most ``size`` partitions."""
    out: list[list[str]] = []
    for batch in batches:
        cur: list[str] = []
        for p in batch:
            gap = cur and dt.date.fromisoformat(p) - dt.date.fromisoformat(cur[-1]) != dt.timedelta(
                days=1
            )
            if cur and (gap or len(cur) >= size):
                out.append(cur)
                cur = []
            cur.append(p)
        if cur:
            out.append(cur)
    return out


def daemon_running(instance: dg.DagsterInstance) -> bool:
    """True when a dagster-daemon (e.g. the one `dagster dev` starts) is heartbeating."""
    from dagster._daemon.controller import all_daemons_live

    try:
        return bool(all_daemons_live(instance, heartbeat_tolerance_seconds=60))
    except Exception:
        return False


def drive_backfill(
    instance: dg.DagsterInstance,
    backfill_id: str,
    *,
    workspace_file: str,
    timeout_s: float = 3600,
    poll_s: float = 1.0,
    log=print,  # type: ignore[no-untyped-def]
) -> str:
    """Run the daemon's backfill and run-queue iterations here until the backfill ends.

    What ``dagster-daemon`` does every 30 s, done every ``poll_s``: the runs are launched
    by the instance's run launcher exactly as the daemon would launch them.
    """
    import logging

    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.backfill import execute_backfill_iteration
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    logger = logging.getLogger("zipline_dagster.lineage.backfill")
    queue = QueuedRunCoordinatorDaemon(interval_seconds=poll_s)
    deadline = time.monotonic() + timeout_s
    last = ""
    with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[workspace_file])) as ctx:
        while True:
            for _ in execute_backfill_iteration(ctx, logger):
                pass
            for _ in queue.run_iteration(ctx):
                pass
            backfill = instance.get_backfill(backfill_id)
            if backfill is None:
                raise BackfillError(f"backfill {backfill_id} disappeared")
            runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            states = sorted(str(r.dagster_run.status.value) for r in runs)
            summary = f"{backfill.status.value}: {len(runs)} runs " + (
                ", ".join(f"{states.count(s)} {s.lower()}" for s in sorted(set(states)))
                if states
                else ""
            )
            if summary != last:
                log(summary)
                last = summary
            if backfill.status != BulkActionStatus.REQUESTED:
                return str(backfill.status.value)
            if time.monotonic() > deadline:
                raise BackfillError(f"backfill {backfill_id} still running after {timeout_s:.0f}s")
            time.sleep(poll_s)
