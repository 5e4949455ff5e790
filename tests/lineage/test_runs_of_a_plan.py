"""How a backfill plan is cut into runs: consecutive days only, at most the asset's
``max_partitions_per_run`` per run (the model's range job holds at most that many)."""

from __future__ import annotations

from zipline_dagster.lineage.backfill import contiguous_runs
from zipline_dagster.lineage.partitions import PARTITIONS_PER_RUN
from zipline_dagster.storage.days import days_between


def test_a_long_range_runs_in_bounded_consecutive_runs() -> None:
    days = days_between("2026-01-01", "2026-03-06")  # 65 days
    runs = contiguous_runs([days], PARTITIONS_PER_RUN)
    assert [len(r) for r in runs] == [30, 30, 5]
    assert [d for r in runs for d in r] == days  # nothing lost, nothing twice, in order


def test_a_gap_splits_a_run() -> None:
    days = ["2026-01-01", "2026-01-02", "2026-01-05", "2026-01-06"]
    assert contiguous_runs([days], 30) == [days[:2], days[2:]]
    assert contiguous_runs([days], 1) == [[d] for d in days]
