"""Warehouse tables: ``{warehouse}/ns/name/ds=YYYY-MM-DD/*.parquet``, one folder per day."""

from __future__ import annotations

import datetime as dt

from zipline_dagster.paths import table_uri
from zipline_dagster.storage import BlobStore


def days_between(start: str, end: str) -> list[str]:
    """Every day from ``start`` to ``end``, inclusive."""
    d0, d1 = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    return [(d0 + dt.timedelta(days=n)).isoformat() for n in range((d1 - d0).days + 1)]


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


def existing_partitions(store: BlobStore, warehouse: str, table: str) -> dict[str, int]:
    """{ds: number of parquet files} for every partition folder the table has."""
    root = table_uri(warehouse, table)
    out: dict[str, int] = {}
    for uri in store.list(root):
        rel = uri[len(root) :].lstrip("/")
        part, _, name = rel.partition("/")
        if part.startswith("ds=") and name.endswith(".parquet") and "/" not in name:
            out[part[3:]] = out.get(part[3:], 0) + 1
    return out


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
    """Replace partition ``ds`` of ``table`` with a pandas frame (one parquet file).

    Timestamps are stored in microseconds, the finest unit Spark reads.
    """
    import io

    from zipline_dagster.paths import join_uri, table_partition_uri

    folder = table_partition_uri(warehouse, table, ds)
    uri = join_uri(folder, "part-00000.parquet")
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)  # type: ignore[attr-defined]
    for old in store.list(folder):
        if old != uri:
            store.delete(old)
    store.write_bytes(uri, buf.getvalue())
    return uri
