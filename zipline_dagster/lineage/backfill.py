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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from zipline_dagster.lineage.ledger import (
    ARTIFACT_ROOT,
    CODE_VERSION_TAG,
    Difference,
    Ledger,
    State,
)
from zipline_dagster.lineage.partitions import model_asset_key, scored_by
from zipline_dagster.storage.blobs import BlobStore, blob_store
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.commits import Commit
from zipline_dagster.storage.resources import warehouse_of
from zipline_dagster.storage.table_days import TableDay
from zipline_dagster.storage.tables import TABLE_NAME, WRITE_ID, Tables

#: A table asset's definition metadata naming its Iceberg table: where a day Dagster has
#: no record of is looked for (a new or restored instance adopts what the catalog holds).
TABLE_OF_ASSET = "zipline/table"

DATA_VERSION_TAG = "dagster/data_version"
#: a run in one of these (``DagsterRunStatus`` values, GraphQL's names too) is still going
IN_PROGRESS = frozenset({"QUEUED", "NOT_STARTED", "MANAGED", "STARTING", "STARTED", "CANCELING"})


def plan_done(
    targets: set[tuple[dg.AssetKey, str | None]] | None,
    statuses: list[str],
    made: Callable[[], Iterable[tuple[dg.AssetKey | None, str | None]]],
) -> bool:
    """Whether a backfill has ended with its plan done: a run of it has materialized each
    of its ``targets`` (asset partitions) and none of its runs (``statuses``) is still
    going, e.g. after a failed run's retry; the daemon marks it so only at its next pass,
    up to 30 s later. ``made`` (what its runs materialized) is read only then. The one
    rule of ``backfill --wait``, run here or through a deployment's webserver."""
    return bool(targets and statuses and not set(statuses) & IN_PROGRESS and targets <= set(made()))


class BackfillError(ValueError):
    """The backfill request is invalid (unknown asset, partition out of range ...)."""


class RunFailed(RuntimeError):
    """A run of a plan, run in this process, failed: names its asset and partitions, the
    step's error and the run (whose whole log is in the Dagster UI)."""


@dataclass
class Plan:
    """Asset partitions to materialize, in dependency order, and why each is included."""

    steps: list[tuple[dg.AssetKey, list[str]]] = field(default_factory=list)
    reasons: dict[tuple[dg.AssetKey, str], str] = field(default_factory=dict)
    fresh: list[tuple[dg.AssetKey, str]] = field(default_factory=list)
    #: partitions a run still going committed and has not recorded: left to it, and why
    in_flight: dict[tuple[dg.AssetKey, str], str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        lines = [
            f"  {key.to_user_string()} {part}: left out, {why}"
            for (key, part), why in self.in_flight.items()
        ]
        if self.empty:
            other = " other" if lines else ""
            return "\n".join([*lines, f"nothing to do: every{other} requested partition is fresh"])
        for key, parts in self.steps:
            full = {self.reasons[(key, p)] for p in parts}
            # one reason is shown whole; several are summed up by kind
            why = sorted(full) if len(full) == 1 else sorted({r.split(":")[0] for r in full})
            lines.append(f"  {key.to_user_string()}: {span_text(parts)} ({', '.join(why)})")
        return "\n".join(lines)


def span_text(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{len(parts)} partitions {parts[0]}..{parts[-1]}"


class FreshnessResolver:
    """Per-partition freshness from the instance's materialization records."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        graph: Any,
        *,
        ledger: Ledger | None = None,
        store: Callable[[str], BlobStore] | None = None,
        tables: Tables | None = None,
    ) -> None:
        self.instance = instance
        self.graph = graph
        self.ledger = ledger or Ledger(instance)
        #: opens storage as the code location's runs do (its warehouse resource)
        self.store = store or blob_store
        self._tables = tables
        self._ids: dict[dg.AssetKey, dict[str, int]] = {}
        self._versions: dict[dg.AssetKey, dict[str, str]] = {}
        self._artifacts: dict[dg.AssetKey, dict[str, str]] = {}
        #: a table partition's recorded folder and table, and each table's commits on storage
        self._writes: dict[dg.AssetKey, dict[str, tuple[str, str]]] = {}
        self._stored: dict[str, dict[str, TableDay]] = {}
        self._memo: dict[tuple[dg.AssetKey, str], str] = {}
        self._observed: dict[dg.AssetKey, dict[str, str | None]] = {}
        #: the model partition that scored a scores day, when it is not the mapped ds-1
        self._scored_by: dict[dg.AssetKey, dict[str, str]] = {}

    def latest_ids(self, key: dg.AssetKey) -> dict[str, int]:
        """{partition: storage id of its latest materialization (observation, for a
        source)} of ``key``."""
        if key not in self._ids:
            node = self.graph.get(key)
            event = (
                dg.DagsterEventType.ASSET_MATERIALIZATION
                if node.is_materializable
                else dg.DagsterEventType.ASSET_OBSERVATION
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
            dg.DagsterEventType.ASSET_OBSERVATION,
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

    def tables_at(self, folder: str, table: str) -> Tables:
        """The warehouse's tables: the code location's (given), else the embedded catalog
        of the warehouse a recorded day's folder (``{warehouse}/ns/name/data/ds=...``) is in."""
        if self._tables is not None:
            return self._tables
        from zipline_dagster.storage.resources import WarehouseResource

        suffix = "/" + "/".join([*table.split(".", 1), "data", folder.rsplit("/", 1)[-1]])
        warehouse = folder[: -len(suffix)] if folder.endswith(suffix) else folder
        return WarehouseResource(uri=warehouse).tables()

    def _code_versions(self, key: dg.AssetKey) -> dict[str, str]:
        if key not in self._versions:
            ids = self.latest_ids(key)
            versions: dict[str, str] = {}
            artifacts: dict[str, str] = {}
            writes: dict[str, tuple[str, str]] = {}
            scored: dict[str, str] = {}
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
                        self.ledger.remember(key, mat.partition, r)  # read once, here
                        md = mat.metadata
                        path, table = md.get("path"), md.get(TABLE_NAME)
                        if path is not None and table is not None and WRITE_ID in md:
                            writes[mat.partition] = (str(path.value), str(table.value))
                        if (used := scored_by(md)) is not None:  # a scores day
                            scored[mat.partition] = used
            self._versions[key] = versions
            self._scored_by[key] = scored
            self._artifacts[key] = artifacts
            self._writes[key] = writes
        return self._versions[key]

    def _commit(self, key: dg.AssetKey, partition: str) -> tuple[Commit | None, str] | str | None:
        """What storage holds committed for a partition (its commit, or None, and where it
        was looked for), found where Dagster's record of it, the model asset's
        ``ARTIFACT_ROOT`` or the table asset's Iceberg table (with the code location's
        tables) says; None when none says where (an external table); a reason when
        storage cannot be read."""
        from zipline_dagster.storage.blobs import BlobStorageError
        from zipline_dagster.storage.manifests import model_partition
        from zipline_dagster.storage.paths import join_uri

        self._code_versions(key)
        root = self.graph.get(key).metadata.get(ARTIFACT_ROOT)
        model_dir = self._artifacts.get(key, {}).get(partition) or (
            join_uri(str(getattr(root, "value", root)), partition) if root else None
        )
        try:
            if model_dir is not None:
                stored = model_partition(self.store(model_dir), model_dir, partition)
                return stored.commit(), f"no complete {stored.manifest_uri}"
            recorded = self._writes.get(key, {}).get(partition)
            declared = self.graph.get(key).metadata.get(TABLE_OF_ASSET)
            if recorded is None and (declared is None or self._tables is None):
                return None  # nothing says where it would be
            folder, table = recorded or ("", str(getattr(declared, "value", declared)))
            if table not in self._stored:
                self._stored[table] = self.tables_at(folder, table).days(table)
            held = self._stored[table].get(partition)
            return (held.commit if held else None), f"no committed {table} {partition}"
        except (BlobStorageError, WarehouseError) as exc:
            return f"its storage cannot be read ({exc})"

    def settle(self, key: dg.AssetKey, partition: str) -> tuple[Difference, str] | str | None:
        """The ledger's rule for a partition's commit: its difference, and where the
        commit was looked for. A commit whose run ended without recording it is recorded
        into Dagster from storage first (and ``key``'s records read again). None when
        nothing says where to look (an external table, a table day never recorded); a
        reason when storage cannot be read."""
        found = self._commit(key, partition)
        if found is None or isinstance(found, str):
            return found
        commit, where = found
        diff = self.ledger.settle(key, partition, commit)
        if diff.state is State.RECORDED:
            for cache in (
                self._ids,
                self._versions,
                self._artifacts,
                self._writes,
                self._scored_by,
            ):
                cache.pop(key, None)
        return diff, where

    def why_off_storage(self, key: dg.AssetKey, partition: str) -> str | None:
        """Why the ledger's rule says a partition must be materialized (Dagster recorded
        it, and it is not committed on storage, or storage cannot be read), or None."""
        settled = self.settle(key, partition)
        if settled is None or isinstance(settled, str):
            return settled
        diff, where = settled
        if diff.state is not State.MISSING:
            return None
        if diff.commit is None and self._artifacts.get(key, {}).get(partition):
            return f"its finished model is missing on storage ({where})"
        return f"it is not committed on storage ({where})"

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
            scored = self._scored_by.get(key, {}).get(partition)
            if scored and scored not in days and parent == self._model_of(node):
                days.append(scored)  # scored by an older partition (ds-1 failed its gates)
            out.extend((parent, d) for d in days if pdef.has_partition_key(d))
        return out

    @staticmethod
    def _model_of(node: Any) -> dg.AssetKey | None:
        name = node.metadata.get("zipline/model_name")
        return model_asset_key(str(getattr(name, "value", name))) if name else None

    def _adoptable(self, node: Any) -> bool:
        """Whether storage says where the asset's partitions are without Dagster's record:
        a model (its artifact root), or a table with the code location's catalog."""
        return ARTIFACT_ROOT in node.metadata or (
            TABLE_OF_ASSET in node.metadata and self._tables is not None
        )

    def _adopt(self, key: dg.AssetKey, partition: str) -> tuple[Difference, str] | str | None:
        """A partition storage holds and Dagster never recorded (a model partition, a
        table day): the ledger's rule, upstream first, so that what it read is recorded
        before it."""
        for pkey, ppart in self.parents(key, partition):
            self.status(pkey, ppart)
        return self.settle(key, partition)

    def status(self, key: dg.AssetKey, partition: str) -> str:
        """'fresh', 'missing', 'stale: <why>', or 'in flight: <why>' (a model partition
        a run still going committed and has not recorded yet: left to that run)."""
        memo_key = (key, partition)
        if memo_key not in self._memo:
            self._memo[memo_key] = self._status(key, partition)
        return self._memo[memo_key]

    def _status(self, key: dg.AssetKey, partition: str) -> str:
        node = self.graph.get(key)
        ids = self.latest_ids(key)
        settled = None
        if node.is_materializable and partition not in ids and self._adoptable(node):
            settled = self._adopt(key, partition)
            ids = self.latest_ids(key)
        if isinstance(settled, tuple) and settled[0].state is State.IN_FLIGHT:
            return f"{State.IN_FLIGHT}: {settled[0].describe()}"
        if not node.is_materializable:
            return "fresh"  # observed from outside; the run-time checks see what exists
        if partition not in ids:
            # never recorded; with a reason when storage could not say what it holds
            return f"missing: {settled}" if isinstance(settled, str) else "missing"
        off_storage = self.why_off_storage(key, partition)  # may record it from storage
        if off_storage:
            return f"stale: {off_storage}"
        if node.code_version and self._code_versions(key).get(partition) != node.code_version:
            return f"stale: code version changed to {node.code_version}"
        return self._upstream_status(key, partition, self.latest_ids(key)[partition])

    def _upstream_status(self, key: dg.AssetKey, partition: str, recorded: int) -> str:
        """'fresh', or 'stale: <why>' when a parent partition is not fresh or was
        updated after ``recorded`` (the partition's latest record): a materialized parent
        by its record, an observed one by its observed data version."""
        observed: dict[dg.AssetKey, list[str]] = {}
        for pkey, ppart in self.parents(key, partition):
            pstatus = self.status(pkey, ppart)
            if pstatus != "fresh":
                return f"stale: upstream {pkey.to_user_string()} {ppart} is {pstatus.split(':')[0]}"
            if self.latest_ids(pkey).get(ppart, 0) <= recorded:
                continue
            if not self.graph.get(pkey).is_materializable:
                observed.setdefault(pkey, []).append(ppart)  # its data version says
                continue
            return f"stale: upstream {pkey.to_user_string()} {ppart} was updated after it"
        for pkey, parts in observed.items():
            changed = self.observed_changed_since(pkey, parts, recorded)
            if changed:
                return (
                    f"stale: upstream {pkey.to_user_string()} {changed} was updated "
                    "after it (its observed data version changed)"
                )
        return "fresh"


def plan_backfill(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    target: dg.AssetKey,
    partitions: Iterable[str],
    *,
    ledger: Ledger | None = None,
) -> Plan:
    """What to materialize, upstream first, for ``target``'s ``partitions``: every
    missing or stale partition they need. The ledger's rule applies to each partition
    read (``ledger``: with the models' judge, so that one recorded from storage has its
    checks evaluated)."""
    graph = _checked_graph(defs, target)
    warehouse = warehouse_of(defs)
    resolver = FreshnessResolver(
        instance, graph, ledger=ledger, store=warehouse.store, tables=warehouse.tables()
    )
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
        if status.startswith(State.IN_FLIGHT):  # the ledger's rule: left to the run writing it
            plan.in_flight[(key, part)] = status
            continue
        needed.setdefault(key, set()).add(part)
        plan.reasons[(key, part)] = status
        stack.extend(p for p in resolver.parents(key, part) if graph.get(p[0]).is_materializable)
    for key in graph.toposorted_asset_keys:
        if key in needed:
            plan.steps.append((key, sorted(needed[key])))
    return plan


def _checked_graph(defs: dg.Definitions, target: dg.AssetKey) -> Any:
    graph = defs.resolve_asset_graph()
    if not graph.has(target) or not graph.get(target).is_materializable:
        known = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        raise BackfillError(
            f"no asset {target.to_user_string()!r} in the code location; known: {', '.join(known)}"
        )
    return graph


def code_version_changed(instance: dg.DagsterInstance, graph: Any, key: dg.AssetKey) -> bool:
    """Unpartitioned ``key`` was materialized under another code version than it has now
    (a champion whose gates changed): Dagster shows it unsynced."""
    event = instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event is not None else None
    if mat is None:
        return False
    return (mat.tags or {}).get(CODE_VERSION_TAG) != graph.get(key).code_version


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


def contiguous_runs(batches: list[list[str]], size: int) -> list[list[str]]:
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
