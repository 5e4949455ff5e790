"""The one daily partitions definition every feature, label, table and model shares."""

from __future__ import annotations

import dagster as dg

PARTITIONS_START = "2026-07-01"

daily_partitions = dg.DailyPartitionsDefinition(start_date=PARTITIONS_START)
