"""Days: the partitions every table and model shares (ISO ``YYYY-MM-DD`` strings)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

#: The partition column of every table.
DAY = "ds"


def days_between(start: str, end: str) -> list[str]:
    """Every day from ``start`` to ``end``, inclusive."""
    d0, d1 = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    return [(d0 + dt.timedelta(days=n)).isoformat() for n in range((d1 - d0).days + 1)]


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


def format_days(days: Sequence[str]) -> str:
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


def days_filter(days: Sequence[str]) -> str:
    """An Iceberg row filter selecting ``days`` (ISO days: nothing to escape)."""
    return f"{DAY} IN ({', '.join(repr(dt.date.fromisoformat(d).isoformat()) for d in days)})"
