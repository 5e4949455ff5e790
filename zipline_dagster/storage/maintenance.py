"""Keeping a table's metadata small: snapshots past retention expire, manifests compact.

Every commit adds a snapshot and (pyiceberg's fast append) a manifest, so planning a
table's days reads more manifests with every write. ``maintain`` merges the current
snapshot's manifests into few (an empty merge append) and expires the snapshots older
than the retention, except those tagged: the snapshots a champion, current or in its
history, trained on carry a tag (``keep``), so a champion can always be reproduced.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from zipline_dagster.storage.catalog import reason
from zipline_dagster.storage.iceberg_internals import transaction
from zipline_dagster.storage.table_days import TableError
from zipline_dagster.storage.tables import Tables

#: The snapshot summary property of a maintenance commit.
MAINTENANCE = "zipline.maintenance"
#: Iceberg's table property: how many manifests a merge append merges at least (only
#: maintenance merges: the platform's appends stay fast appends)
MERGE_AT = "commit.manifest.min-count-to-merge"
MERGE_ON = "commit.manifest-merge.enabled"


@dataclass(frozen=True)
class Maintained:
    """What one table's maintenance did."""

    table: str
    manifests_before: int
    manifests_after: int
    snapshots_before: int
    snapshots_after: int
    tagged: tuple[str, ...]

    def describe(self) -> str:
        return (
            f"{self.table}: manifests {self.manifests_before} -> {self.manifests_after}, "
            f"snapshots {self.snapshots_before} -> {self.snapshots_after}"
            + (f", kept by tag: {', '.join(self.tagged)}" if self.tagged else "")
        )


def maintain(
    tables: Tables,
    table: str,
    *,
    retain: dt.timedelta,
    keep: dict[str, int] | None = None,
    now: dt.datetime | None = None,
) -> Maintained | None:
    """Tag ``keep`` ({tag: snapshot id}), compact the current snapshot's manifests, then
    expire the untagged snapshots older than ``retain``. None when the table does not
    exist.

    Raises:
        TableError: the catalog refused a commit (named); the table is as it was.
    """
    found = tables.load(table)
    if found is None or found.current_snapshot() is None:
        return None
    before = len(found.current_snapshot().manifests(found.io))
    snapshots = len(found.snapshots())
    known = {s.snapshot_id for s in found.snapshots()}
    tags = {name: sid for name, sid in (keep or {}).items() if sid in known}
    try:
        _tag(found, tags)
        if before > 1:
            _compact(found)
        cutoff = (now or dt.datetime.now(dt.UTC)) - retain
        found = tables.load(table)
        assert found is not None
        found.maintenance.expire_snapshots().older_than(cutoff).commit()
    except Exception as exc:  # pyiceberg's commit and catalog errors
        raise TableError(f"table {table}: maintenance failed ({reason(exc)})") from exc
    found = tables.load(table)
    assert found is not None
    return Maintained(
        table,
        before,
        len(found.current_snapshot().manifests(found.io)),
        snapshots,
        len(found.snapshots()),
        tuple(sorted(tags)),
    )


def _tag(found: Any, tags: dict[str, int]) -> None:
    """Tag the snapshots to keep (a tagged snapshot never expires)."""
    fresh = [name for name in tags if name not in found.refs()]
    if fresh:
        with found.manage_snapshots() as refs:
            for name in fresh:
                refs.create_tag(tags[name], name)


def _compact(found: Any) -> None:
    """Merge the current snapshot's manifests: an empty merge append."""
    with transaction(found) as tx:  # read by the merge, so set first
        tx.set_properties({MERGE_AT: "2", MERGE_ON: "true"})
    with transaction(found) as tx:
        compact = tx.update_snapshot(snapshot_properties={MAINTENANCE: "compact"})
        with compact.merge_append():
            pass  # no new file: the existing manifests merge
        tx.set_properties({MERGE_ON: "false"})  # the platform's appends stay fast
