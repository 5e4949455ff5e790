"""Warehouse maintenance: old snapshots expire and manifests compact, the days a table
holds are unchanged, and a snapshot a champion trained on (tagged) survives."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from tests.helpers import tables_of, write_partition
from zipline_dagster.rollout.maintenance import build_maintenance
from zipline_dagster.storage.days import days_between
from zipline_dagster.storage.maintenance import maintain
from zipline_dagster.storage.resources import WarehouseResource

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
