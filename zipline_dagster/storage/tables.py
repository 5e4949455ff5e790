"""Warehouse tables: ``{warehouse}/ns/name/ds=YYYY-MM-DD/*.parquet``, one folder per day.

Partitions are replaced atomically. A writer puts its new data files (named by its write
id) beside the old ones, then swaps the partition's commit marker ``_COMMITTED.json``
(one atomic object write) to list the new files, then deletes the rest. Readers read
exactly the files the marker lists, so at any moment, whatever dies in between, they
see the old partition or the new one, never a mix. A first write of a partition starts
with a marker that says "in progress" (``"files": null``): until it commits, the
partition is missing, not partial. A folder with no marker (a table another system
writes) is read as all its parquet files.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator

from zipline_dagster.storage.blobs import BlobStorageError, BlobStore, LocalStore
from zipline_dagster.storage.commits import TABLE, Commit
from zipline_dagster.storage.paths import join_uri, table_partition_uri, table_uri

#: The partition's commit marker; the trainers read the same file (``trainer/io.py``).
COMMIT_NAME = "_COMMITTED.json"
#: Where a Spark range write lands before its partitions are committed one by one.
STAGING_DIR = "_staging"
#: Commit markers read at once from an object store, where each read's time is mostly the
#: store's latency (a year of daily partitions is 365 reads per listing); a local store
#: reads them one after another.
CONCURRENT_READS = 8


def days_between(start: str, end: str) -> list[str]:
    """Every day from ``start`` to ``end``, inclusive."""
    d0, d1 = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    return [(d0 + dt.timedelta(days=n)).isoformat() for n in range((d1 - d0).days + 1)]


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


_LISTINGS: contextvars.ContextVar[dict[tuple[str, str], dict[str, list[str]]] | None] = (
    contextvars.ContextVar("zipline_table_listings", default=None)
)


@contextlib.contextmanager
def one_listing_per_table() -> Iterator[None]:
    """Within this block (one step of a run), each table is listed once: later reads of
    the same table reuse the first listing. For steps that read tables they do not write."""
    token = _LISTINGS.set({})
    try:
        yield
    finally:
        _LISTINGS.reset(token)


def committed_partitions(
    store: BlobStore, warehouse: str, table: str, *, listed: list[str] | None = None
) -> dict[str, list[str]]:
    """{ds: URIs of its committed parquet files} for every complete partition, from one
    listing of the table (plus one read of each partition's marker); inside
    ``one_listing_per_table`` the first listing is reused. ``listed``: the table's
    objects, when the caller has just listed them."""
    cache = _LISTINGS.get()
    if cache is not None and listed is None:
        key = (warehouse, table)
        if key not in cache:
            cache[key] = _list_committed(store, warehouse, table)
        return cache[key]
    return _list_committed(store, warehouse, table, listed)


def _list_committed(
    store: BlobStore, warehouse: str, table: str, listed: list[str] | None = None
) -> dict[str, list[str]]:
    return {
        ds: files
        for ds, (files, _) in committed_scan(store, table_uri(warehouse, table), listed).items()
    }


def committed_scan(
    store: BlobStore, root: str, listed: list[str] | None = None
) -> dict[str, tuple[list[str], Commit]]:
    """{ds: (URIs of its committed parquet files, its commit)} for every complete
    partition of the table at ``root``, from one listing (``listed``: the table's objects,
    when the caller has just listed them) plus one read per marker."""
    parquet: dict[str, list[str]] = {}
    markers: set[str] = set()
    for uri in store.list(root) if listed is None else listed:
        rel = uri[len(root) :].lstrip("/")
        part, _, name = rel.partition("/")
        if not part.startswith("ds=") or "/" in name:
            continue
        if name == COMMIT_NAME:
            markers.add(part[3:])
        elif name.endswith(".parquet"):
            parquet.setdefault(part[3:], []).append(uri)
    marked = sorted(markers)
    folders = {ds: join_uri(root, f"ds={ds}") for ds in marked}
    reads = _read_all(store, [join_uri(folders[ds], COMMIT_NAME) for ds in marked])
    bodies = dict(zip(marked, reads, strict=True))
    out: dict[str, tuple[list[str], Commit]] = {}
    for ds in sorted(markers | set(parquet)):
        folder = join_uri(root, f"ds={ds}")
        if ds in bodies:
            body = json.loads(bodies[ds])
            files = body.get("files")
            if files is not None:  # None: a first write still in progress
                commit = Commit(
                    TABLE,
                    ds,
                    folder,
                    _text(body.get("write_id")),
                    run_id=_text(body.get("dagster_run_id")),
                    at=body.get("committed_at"),
                    code_version=_text(body.get("code_version")),
                    table_uri=root,
                )
                out[ds] = ([join_uri(folder, n) for n in files], commit)
        else:  # written by another system, with no marker: no write named
            out[ds] = (sorted(parquet[ds]), Commit(TABLE, ds, folder, None, table_uri=root))
    return out


def _text(value: object) -> str | None:
    return str(value) if value else None


def _read_all(store: BlobStore, uris: list[str]) -> list[bytes]:
    """The objects at ``uris``, in order: ``CONCURRENT_READS`` at a time on an object
    store, one after another on a local one. An error is the first, in order, to fail."""
    if isinstance(store, LocalStore) or len(uris) <= 1:
        return [store.read_bytes(uri) for uri in uris]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(CONCURRENT_READS, len(uris))) as pool:
        return list(pool.map(store.read_bytes, uris))


def existing_partitions(store: BlobStore, warehouse: str, table: str) -> dict[str, int]:
    """{ds: number of committed parquet files} for every complete partition of the table."""
    return {ds: len(files) for ds, files in committed_partitions(store, warehouse, table).items()}


#: The materialization metadata naming the write that committed a table partition (with
#: ``path``, the partition's folder): what the planner compares with storage's marker.
WRITE_ID = "write_id"
#: The materialization metadata naming a table partition's table (its root folder): where
#: the planner scans for the table's commits, so nothing parses it out of ``path``.
TABLE_URI = "table_uri"


def new_write_id() -> str:
    """Names one write's files: sortable by time, unique across writers."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def begin_partition(store: BlobStore, folder: str) -> None:
    """Before a partition's first write: mark it in progress (readers see it missing)."""
    marker = join_uri(folder, COMMIT_NAME)
    if not store.exists(marker):
        store.write_bytes(marker, json.dumps({"files": None, "in_progress": True}).encode())


def commit_partition(
    store: BlobStore,
    folder: str,
    files: list[str],
    *,
    write_id: str,
    rows: int,
    run_id: str | None = None,
    code_version: str | None = None,
) -> list[str]:
    """Swap the marker to ``files`` (names inside ``folder``), then delete the rest. The
    marker names the write, the Dagster run that made it (``run_id``) and the
    ``code_version`` that wrote it, as a model's manifest does.

    The partition is committed once the marker is written: only that write's failure
    raises. Deleting the files it replaced is tidying (readers never read them), so a
    delete that fails (a role allowed to write but not to delete, say) leaves the file
    where it is, for the partition's next commit to delete; returns those left behind
    (the folder itself when it could not even be listed).
    """
    marker = join_uri(folder, COMMIT_NAME)
    body = {
        "files": files,
        "write_id": write_id,
        "rows": rows,
        "committed_at": time.time(),
        "dagster_run_id": run_id,
        "code_version": code_version,
    }
    store.write_bytes(marker, json.dumps(body, sort_keys=True).encode())
    keep = {join_uri(folder, f) for f in files} | {marker}
    left = []
    try:
        replaced = [uri for uri in store.list(folder) if uri not in keep]
    except (BlobStorageError, OSError):  # not even listed: the next commit lists again
        return [folder]
    for uri in replaced:
        try:
            store.delete(uri)
        except (BlobStorageError, OSError):
            left.append(uri)
    return left


def left_behind(table: str, ds: str, left: list[str]) -> str:
    """The warning for a committed partition whose replaced files ``commit_partition``
    could not delete."""
    return (
        f"{table} {ds} is committed, but the files it replaced could not be deleted (left "
        f"for the partition's next commit to delete, never read): {', '.join(left)}"
    )


def format_days(days: list[str]) -> str:
    """Compact day ranges: 2026-07-01..2026-07-03, 2026-07-05."""
    if not days:
        return "none"
    parts: list[str] = []
    start = prev = dt.date.fromisoformat(days[0])
    for d in [dt.date.fromisoformat(x) for x in days[1:]] + [None]:
        if d is not None and d - prev == dt.timedelta(days=1):
            prev = d
            continue
        parts.append(start.isoformat() if start == prev else f"{start}..{prev}")
        if d is not None:
            start = prev = d
    return ", ".join(parts)


def write_partition_frame(
    store: BlobStore, warehouse: str, table: str, ds: str, frame: object
) -> str:
    """Replace partition ``ds`` of ``table`` with a pandas frame (one parquet file),
    atomically (see the module doc). Timestamps are stored in microseconds, the finest
    unit Spark reads."""
    import io

    folder = table_partition_uri(warehouse, table, ds)
    write_id = new_write_id()
    name = f"part-{write_id}-00000.parquet"
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)  # type: ignore[attr-defined]
    begin_partition(store, folder)
    store.write_bytes(join_uri(folder, name), buf.getvalue())
    commit_partition(store, folder, [name], write_id=write_id, rows=len(frame))  # type: ignore[arg-type]
    return join_uri(folder, name)
