"""What a table holds: its committed days at a snapshot, read from the catalog's
metadata (``table_days``), and the snapshot a window is read at (``window_snapshot``).
Written by ``storage.tables`` (which re-exports these names); read by every consumer of
a table's days (the ledger, training, scoring, monitoring, Spark inputs)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.commits import TABLE, Commit
from zipline_dagster.storage.days import DAY

#: Snapshot summary properties of the platform's commits.
WRITE = "zipline.write"
RUN = "zipline.dagster-run-id"
DAYS = "zipline.days"
CODE_VERSION = "zipline.code-version"
#: Table property marking a day computed with no rows (its value: the commit's summary).
EMPTY = "zipline.empty."


class TableError(WarehouseError):
    """A table cannot be read or written; names the table and why."""


@dataclass(frozen=True)
class TableDay:
    """One committed day of a table, as the catalog holds it."""

    table: str
    ds: str
    #: its data files (URIs), in the order the snapshot lists them
    files: tuple[str, ...]
    rows: int
    #: the snapshot that last wrote the day (None: an empty day, or its snapshot expired)
    snapshot_id: int | None
    #: the platform write that committed it (None: written by another engine)
    write: str | None
    run_id: str | None = None
    code_version: str | None = None
    at: float | None = None
    uri: str = ""
    #: the snapshot's sequence number: which of two snapshots is newer
    sequence: int = 0
    #: the oldest snapshot the table still holds that shows the day as it is:
    #: ``snapshot_id`` itself until maintenance expires it (its files stay, in the
    #: snapshots after it); None: none is held (an empty day)
    readable_at: int | None = None

    @property
    def data_version(self) -> str:
        """The snapshot that last wrote the day (an empty day: the write that emptied it)."""
        return str(self.snapshot_id) if self.snapshot_id is not None else f"empty-{self.write}"

    @property
    def commit(self) -> Commit:
        return Commit(
            TABLE,
            self.ds,
            self.uri,
            self.write,
            run_id=self.run_id,
            at=self.at,
            code_version=self.code_version,
            table=self.table,
        )


def snapshot_summary(snapshot: Any) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot is not None else {}


def _day_reader(found: Any) -> Callable[[Any, bool], str]:
    """A function of (a value of the table's ``ds`` partition field, whether it is a
    manifest's serialized bound) to the day it is (YYYY-MM-DD): ``ds`` a string, or a
    date (pyiceberg gives a date partition's value as days since 1970-01-01). The trainer's
    reader (``zipline_runtime.tables``) has its own copy."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import DateType

    kind = found.schema().find_field(found.spec().fields[0].source_id).field_type

    def as_day(value: Any, serialized: bool) -> str:
        if serialized:
            value = from_bytes(kind, value)
        if isinstance(kind, DateType) and isinstance(value, int):
            value = dt.date(1970, 1, 1) + dt.timedelta(days=value)
        return value.isoformat() if isinstance(value, dt.date) else str(value)

    return as_day


def table_days(
    table: str,
    found: Any,
    *,
    snapshot_id: int | None = None,
    only: Collection[str] | None = None,
) -> dict[str, TableDay]:
    """{ds: day} of an Iceberg table (``found``) at ``snapshot_id`` or its current snapshot;
    at the current one, with the days committed empty. ``only``: just those days, read from
    the manifests whose partition bounds hold one of them (the others are not opened)."""
    snapshot = found.snapshot_by_id(snapshot_id) if snapshot_id else found.current_snapshot()
    _check_spec(table, found)
    wanted = None if only is None else set(only)
    per_day = _live_entries(found, snapshot, wanted) if snapshot is not None else {}
    root = str(found.location()).rstrip("/")
    snapshots = {s.snapshot_id: s for s in found.snapshots()}
    out = {ds: _written_day(table, ds, e, snapshots, root) for ds, e in per_day.items()}
    if snapshot_id is None:
        empty = _empty_days(table, found.properties, root)
        out = {**{d: e for d, e in empty.items() if wanted is None or d in wanted}, **out}
    return dict(sorted(out.items()))


def _live_entries(found: Any, snapshot: Any, wanted: set[str] | None) -> dict[str, list[Any]]:
    """{ds: its live manifest entries} at ``snapshot`` (of ``wanted`` days, when given:
    from the manifests whose bounds may hold one)."""
    as_day = _day_reader(found)
    per_day: dict[str, list[Any]] = {}
    for manifest in snapshot.manifests(found.io):
        if wanted is not None and not _may_hold(manifest, wanted, as_day):
            continue
        for entry in manifest.fetch_manifest_entry(found.io, discard_deleted=True):
            ds = as_day(entry.data_file.partition[0], False)
            if wanted is None or ds in wanted:
                per_day.setdefault(ds, []).append(entry)
    return per_day


def _may_hold(manifest: Any, days: set[str], as_day: Callable[[Any, bool], str]) -> bool:
    """Whether a manifest's ``ds`` bounds (its first partition field's summary) hold one of
    ``days``; True when it has none."""
    summary = manifest.partitions[0] if manifest.partitions else None
    if summary is None or summary.lower_bound is None or summary.upper_bound is None:
        return True
    low, high = as_day(summary.lower_bound, True), as_day(summary.upper_bound, True)
    return any(low <= ds <= high for ds in days)


def _written_day(
    table: str, ds: str, entries: list[Any], snapshots: dict[int, Any], root: str
) -> TableDay:
    """A day with data files: the snapshot that last added one names its write."""
    last = max(entries, key=lambda e: e.sequence_number or 0)  # snapshot ids are random
    sid, sequence = last.snapshot_id, last.sequence_number or 0
    snap = snapshots.get(sid)
    summary = snapshot_summary(snap)
    return TableDay(
        table,
        ds,
        tuple(e.data_file.file_path for e in entries),
        sum(e.data_file.record_count for e in entries),
        sid,
        summary.get(WRITE),
        run_id=summary.get(RUN) or None,
        code_version=summary.get(CODE_VERSION) or None,
        at=snap.timestamp_ms / 1000 if snap is not None else None,
        uri=f"{root}/data/{DAY}={ds}",
        sequence=sequence,
        readable_at=sid if sid in snapshots else _first_held_after(snapshots, sequence),
    )


def _first_held_after(snapshots: dict[int, Any], sequence: int) -> int | None:
    """The oldest snapshot held whose sequence number is at least ``sequence``."""
    later = [s for s in snapshots.values() if (s.sequence_number or 0) >= sequence]
    return min(later, key=lambda s: s.sequence_number or 0).snapshot_id if later else None


def _empty_days(table: str, properties: dict[str, str], root: str) -> dict[str, TableDay]:
    """The days committed with no rows (the table's ``zipline.empty.{ds}`` properties)."""
    out = {}
    for key, value in properties.items():
        if key.startswith(EMPTY):
            ds, body = key[len(EMPTY) :], json.loads(value)
            out[ds] = TableDay(
                table,
                ds,
                (),
                0,
                None,
                body.get(WRITE),
                run_id=body.get(RUN) or None,
                code_version=body.get(CODE_VERSION) or None,
                uri=f"{root}/data/{DAY}={ds}",
            )
    return out


def window_snapshot(days: dict[str, TableDay], window: Sequence[str]) -> int | None:
    """The snapshot a window is read at: the newest that wrote one of its days. Each
    window day is there exactly as it is now (no later snapshot touched it), and a
    retrain of a window nobody rewrote reads the same snapshot again. Once maintenance
    expired that snapshot, the oldest one held after it (the same files of these days).
    None: no day of the window has a data file (all empty)."""
    written = [days[d] for d in window if d in days and days[d].snapshot_id is not None]
    if not written:
        return None
    newest = max(written, key=lambda d: d.sequence)
    return newest.readable_at if newest.readable_at is not None else newest.snapshot_id


def _check_spec(table: str, found: Any) -> None:
    spec = found.spec()
    fields = list(spec.fields)
    names = [found.schema().find_column_name(f.source_id) for f in fields]
    if not fields or names[0] != DAY or str(fields[0].transform) != "identity":
        raise TableError(
            f"table {table} is partitioned by {names or 'nothing'}; the platform reads tables "
            f"partitioned by {DAY} (identity) first"
        )
