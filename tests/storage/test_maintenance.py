"""Warehouse maintenance: old snapshots expire and manifests compact, the days a table
holds are unchanged, and a snapshot a champion trained on (tagged) survives."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest
from zipline_runtime.trainer_io import TrainingDataError, plan_window

from tests.helpers import tables_of, write_partition
from zipline_dagster.rollout.maintenance import build_maintenance
from zipline_dagster.storage.days import days_between
from zipline_dagster.storage.maintenance import maintain
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import window_snapshot

TABLE = "ctr.kept"


def test_maintenance_expires_and_compacts_but_keeps_a_champions_snapshot(file_base: str) -> None:
    days = days_between("2026-07-01", "2026-07-20")
    for rewrite in range(2):
        for ds in days:
            write_partition(file_base, TABLE, ds, pd.DataFrame({"x": [rewrite]}))
    tables = tables_of(file_base)
    before = tables.days(TABLE)
    found = tables.load(TABLE)
    champion = before[days[3]].snapshot_id  # a snapshot a model read
    assert champion is not None
    old_rows = found.scan(snapshot_id=champion).to_arrow().num_rows

    done = maintain(
        tables, TABLE, retain=dt.timedelta(0), keep={"champion-m-v-2026-07-04": champion}
    )
    assert done is not None
    assert done.manifests_before >= 20 and done.manifests_after == 1, done.describe()
    assert done.snapshots_before == 60 and done.snapshots_after <= 3, done.describe()
    after = tables.days(TABLE)
    assert {d: (x.rows, x.files) for d, x in after.items()} == {
        d: (x.rows, x.files) for d, x in before.items()
    }
    found = tables.load(TABLE)
    assert "champion-m-v-2026-07-04" in found.refs()
    assert found.scan(snapshot_id=champion).to_arrow().num_rows == old_rows  # still readable
    # a window whose writing snapshots expired is read at the oldest snapshot held after
    # them: same days, same files, and the days' data versions did not move
    window = days[10:14]
    assert all(after[d].data_version == before[d].data_version for d in days)
    at = window_snapshot(after, window)
    held = {s.snapshot_id for s in found.snapshots()}
    assert at in held and before[window[-1]].snapshot_id not in held
    planned = plan_window(found.metadata_location, at, window, "ds").files
    assert {d: tuple(f) for d, f in planned.items()} == {d: after[d].files for d in window}
    # writing goes on after maintenance
    write_partition(file_base, TABLE, days[0], pd.DataFrame({"x": [7, 7]}))
    assert tables.days(TABLE)[days[0]].rows == 2


def test_the_maintenance_job_maintains_every_table_of_the_code_location(file_base: str) -> None:
    for ds in days_between("2026-07-01", "2026-07-05"):
        write_partition(file_base, TABLE, ds, pd.DataFrame({"x": [1]}))
    job, schedule = build_maintenance([TABLE, "ctr.never_written"], [], running=False)
    assert schedule.name == "warehouse_maintenance"
    result = job.execute_in_process(
        run_config={"ops": {"maintain_tables": {"config": {"retain_days": 0}}}},
        resources={"warehouse": WarehouseResource(uri=file_base)},
    )
    assert result.success
    found = tables_of(file_base).load(TABLE)
    assert len(found.current_snapshot().manifests(found.io)) == 1
    assert len(found.snapshots()) == 1  # compacted, then everything older expired


def test_a_window_read_at_a_snapshot_the_table_no_longer_holds_names_it(file_base: str) -> None:
    """pyiceberg plans nothing at an unknown snapshot; the trainer's reader says which
    snapshot, not that every day is missing."""
    write_partition(file_base, TABLE, "2026-07-01", pd.DataFrame({"x": [1]}))
    found = tables_of(file_base).load(TABLE)
    with pytest.raises(
        TrainingDataError,
        match=r"--snapshot-id=12345 is not a snapshot of .*expired by maintenance",
    ):
        plan_window(found.metadata_location, 12345, ["2026-07-01"], "ds")
