"""Shared Dagster conventions: the one daily partitions definition every feature, label,
table and model uses, and the asset key of a table."""

from __future__ import annotations

import dagster as dg

PARTITIONS_START = "2026-07-01"

daily_partitions = dg.DailyPartitionsDefinition(start_date=PARTITIONS_START)


def table_asset_key(table: str) -> dg.AssetKey:
    """The asset producing table ``ns.name`` has the key ``ns/name``."""
    return dg.AssetKey(table.split("."))


def starting_at(
    partitions_def: dg.TimeWindowPartitionsDefinition, start: str
) -> dg.TimeWindowPartitionsDefinition:
    """The same time partitions (schedule, format, zone), from day ``start`` on."""
    return dg.TimeWindowPartitionsDefinition(
        start=start,
        fmt=partitions_def.fmt,
        cron_schedule=partitions_def.cron_schedule,
        timezone=partitions_def.timezone,
        end_offset=partitions_def.end_offset,
    )
