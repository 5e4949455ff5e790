"""A partition's freshness through lineage: fresh when it was materialized with its
asset's current code version and after every partition it reads (transitively fresh
too), else missing or stale, and why; in flight when a run still going committed it
(the ledger's rule). ``FreshnessResolver`` reads it from the instance's records and
storage; the backfill planner (``lineage.backfill``) and a retry's reuse of partitions
(``training.retries``) ask it.

An external table's partition counts as updated after a materialization only when its
observed data version changed since then: observing it again unchanged (the UI's
"Observe sources", a schedule) retrains nothing, as Dagster's own automation treats it.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass
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
from zipline_dagster.storage.blobs import BlobStorageError, BlobStore, blob_store
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.commits import Commit
from zipline_dagster.storage.table_days import TableDay
from zipline_dagster.storage.tables import TABLE_NAME, WRITE_ID, Tables

#: A table asset's definition metadata naming its Iceberg table: where a day Dagster has
#: no record of is looked for (a new or restored instance adopts what the catalog holds).
TABLE_OF_ASSET = "zipline/table"

DATA_VERSION_TAG = "dagster/data_version"


class BackfillError(ValueError):
    """The backfill request is invalid (unknown asset, partition out of range ...)."""


class Kind(enum.StrEnum):
    """What a partition's freshness is (``Freshness.kind``)."""

    FRESH = "fresh"
    #: never recorded in Dagster (and not adopted from storage)
    MISSING = "missing"
    #: recorded, and something it was made from, or its code, changed since
    STALE = "stale"
    #: committed by a run still going, not recorded yet: left to that run (the ledger's rule)
    IN_FLIGHT = State.IN_FLIGHT.value


@dataclass(frozen=True)
class Freshness:
    """A partition's freshness (``FreshnessResolver.status``) and why, when it is not
    fresh; ``str()`` gives ``"stale: <why>"``, as the CLI prints it."""

    kind: Kind
    why: str | None = None

    @property
    def fresh(self) -> bool:
        return self.kind is Kind.FRESH

    def __str__(self) -> str:
        return f"{self.kind}: {self.why}" if self.why else str(self.kind)


FRESH = Freshness(Kind.FRESH)


@dataclass(frozen=True)
class Settled:
    """The ledger's rule applied to a partition's commit as storage holds it, found where
    its records say (``FreshnessResolver.settle``), or why storage could not be read."""

    #: the commit against Dagster's record (None when storage could not be read)
    diff: Difference | None
    #: where the commit was looked for (named when it is not there)
    where: str = ""
    unreadable: str | None = None


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
        self._memo: dict[tuple[dg.AssetKey, str], Freshness] = {}
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

    def _commit(self, key: dg.AssetKey, partition: str) -> tuple[Commit | None, str] | None:
        """What storage holds committed for a partition (its commit, or None, and where it
        was looked for), found where Dagster's record of it, the model asset's
        ``ARTIFACT_ROOT`` or the table asset's Iceberg table (with the code location's
        tables) says; None when none says where (an external table). Raises
        ``BlobStorageError`` or ``WarehouseError`` when storage cannot be read."""
        from zipline_dagster.storage.manifests import model_partition
        from zipline_dagster.storage.paths import join_uri

        self._code_versions(key)
        root = self.graph.get(key).metadata.get(ARTIFACT_ROOT)
        model_dir = self._artifacts.get(key, {}).get(partition) or (
            join_uri(str(getattr(root, "value", root)), partition) if root else None
        )
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

    def settle(self, key: dg.AssetKey, partition: str) -> Settled | None:
        """The ledger's rule for a partition's commit: its difference, and where the
        commit was looked for (or why storage cannot be read). A commit whose run ended
        without recording it is recorded into Dagster from storage first (and ``key``'s
        records read again). None when nothing says where to look (an external table, a
        table day never recorded)."""
        try:
            found = self._commit(key, partition)
        except (BlobStorageError, WarehouseError) as exc:
            return Settled(None, unreadable=f"its storage cannot be read ({exc})")
        if found is None:
            return None
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
        return Settled(diff, where)

    def why_off_storage(self, key: dg.AssetKey, partition: str) -> str | None:
        """Why the ledger's rule says a partition must be materialized (Dagster recorded
        it, and it is not committed on storage, or storage cannot be read), or None."""
        settled = self.settle(key, partition)
        if settled is None or settled.diff is None:  # nowhere to look, or unreadable
            return settled.unreadable if settled else None
        diff, where = settled.diff, settled.where
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

    def _adopt(self, key: dg.AssetKey, partition: str) -> Settled | None:
        """A partition storage holds and Dagster never recorded (a model partition, a
        table day): the ledger's rule, upstream first, so that what it read is recorded
        before it."""
        for pkey, ppart in self.parents(key, partition):
            self.status(pkey, ppart)
        return self.settle(key, partition)

    def status(self, key: dg.AssetKey, partition: str) -> Freshness:
        """The partition's ``Freshness``: fresh, missing, stale (and why), or in flight
        (a partition a run still going committed and has not recorded yet: left to that
        run)."""
        memo_key = (key, partition)
        if memo_key not in self._memo:
            self._memo[memo_key] = self._status(key, partition)
        return self._memo[memo_key]

    def _status(self, key: dg.AssetKey, partition: str) -> Freshness:
        node = self.graph.get(key)
        ids = self.latest_ids(key)
        settled = None
        if node.is_materializable and partition not in ids and self._adoptable(node):
            settled = self._adopt(key, partition)
            ids = self.latest_ids(key)
        if settled is not None and settled.diff and settled.diff.state is State.IN_FLIGHT:
            return Freshness(Kind.IN_FLIGHT, settled.diff.describe())
        if not node.is_materializable:
            return FRESH  # observed from outside; the run-time checks see what exists
        if partition not in ids:
            # never recorded; with a reason when storage could not say what it holds
            return Freshness(Kind.MISSING, settled.unreadable if settled else None)
        off_storage = self.why_off_storage(key, partition)  # may record it from storage
        if off_storage:
            return Freshness(Kind.STALE, off_storage)
        if node.code_version and self._code_versions(key).get(partition) != node.code_version:
            return Freshness(Kind.STALE, f"code version changed to {node.code_version}")
        return self._upstream_status(key, partition, self.latest_ids(key)[partition])

    def _upstream_status(self, key: dg.AssetKey, partition: str, recorded: int) -> Freshness:
        """Fresh, or stale (and why) when a parent partition is not fresh or was
        updated after ``recorded`` (the partition's latest record): a materialized parent
        by its record, an observed one by its observed data version."""
        observed: dict[dg.AssetKey, list[str]] = {}
        for pkey, ppart in self.parents(key, partition):
            pstatus = self.status(pkey, ppart)
            if not pstatus.fresh:
                why = f"upstream {pkey.to_user_string()} {ppart} is {pstatus.kind}"
                return Freshness(Kind.STALE, why)
            if self.latest_ids(pkey).get(ppart, 0) <= recorded:
                continue
            if not self.graph.get(pkey).is_materializable:
                observed.setdefault(pkey, []).append(ppart)  # its data version says
                continue
            why = f"upstream {pkey.to_user_string()} {ppart} was updated after it"
            return Freshness(Kind.STALE, why)
        for pkey, parts in observed.items():
            changed = self.observed_changed_since(pkey, parts, recorded)
            if changed:
                why = (
                    f"upstream {pkey.to_user_string()} {changed} was updated after it (its "
                    "observed data version changed)"
                )
                return Freshness(Kind.STALE, why)
        return FRESH
