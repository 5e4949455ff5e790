"""Iceberg tables: a day is replaced in one commit. A writer killed half-way (kill -9, a
real process) leaves every day as it was before (or, a first write, missing), and the
next write of that day leaves nothing of it behind; concurrent writers of different days
both land; bad columns, and a catalog that cannot be reached, are one clear error."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.helpers import local, tables_of, write_partition
from zipline_dagster.storage.catalog import CatalogError
from zipline_dagster.storage.tables import STAGING_DIR, SchemaMismatch

TABLE = "ctr.atomic"


def read_day(base: str, ds: str) -> pd.DataFrame:
    files = tables_of(base).days(TABLE)[ds].files
    return pd.concat([pd.read_parquet(local(f)) for f in files], ignore_index=True)


def kill_when(proc: subprocess.Popen[Any], appears: Any, timeout: float = 120) -> None:
    """SIGKILL the writer's whole process group the moment ``appears()`` is true."""
    deadline = time.monotonic() + timeout
    while not appears():
        assert proc.poll() is None, "the writer finished before the fault could hit it"
        assert time.monotonic() < deadline, "the writer never got there"
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


PANDAS_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np, pandas as pd
    from tests.helpers import write_partition
    base, ds, rows, version = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    write_partition(base, "ctr.atomic", ds, pd.DataFrame(
        {"version": np.full(rows, version), "x": rng.random(rows), "y": rng.random(rows)}))
    """
)


def start(script: str, *args: str) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def staged(base: str) -> Any:
    """True once a write has begun staging a file (its temp file or the file itself)."""
    folder = local(f"{base}/ctr/atomic/{STAGING_DIR}")
    return lambda: folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


def leftovers(base: str, ds: str, table: str = TABLE) -> list[str]:
    """Files of day ``ds`` that no snapshot names, and anything still staged."""
    tables = tables_of(base)
    found = tables.load(table)
    named = {f for s in found.snapshots() for f in _snapshot_files(found, s)}
    folder = table.replace(".", "/")
    data = local(f"{base}/{folder}/data/ds={ds}")
    stray = (
        [f"file://{p}" for p in data.iterdir() if f"file://{p}" not in named]
        if data.is_dir()
        else []
    )
    staging = local(f"{base}/{folder}/{STAGING_DIR}")
    return stray + [str(p) for p in staging.rglob("*") if p.is_file()]


def _snapshot_files(found: Any, snapshot: Any) -> set[str]:
    return {
        "file://" + e.data_file.file_path.removeprefix("file://")
        for m in snapshot.manifests(found.io)
        for e in m.fetch_manifest_entry(found.io, discard_deleted=True)
    }


def test_pandas_writer_killed_mid_write_leaves_the_old_day(file_base: str) -> None:
    ds = "2026-07-02"
    old = pd.DataFrame({"version": [1] * 100, "x": [0.5] * 100, "y": [0.5] * 100})
    write_partition(file_base, TABLE, ds, old)
    before = tables_of(file_base).days(TABLE)[ds]
    proc = start(PANDAS_WRITER, file_base, ds, "12000000", "2")
    kill_when(proc, staged(file_base))
    # readers see exactly the old day, at the snapshot that wrote it
    after = tables_of(file_base).days(TABLE)[ds]
    assert after.snapshot_id == before.snapshot_id
    got = read_day(file_base, ds)
    assert len(got) == 100 and set(got["version"]) == {1}
    assert leftovers(file_base, ds)  # the killed writer's staged file is there ...
    # ... until the next write of the day: it commits and leaves nothing of the other
    write_partition(file_base, TABLE, ds, old.assign(version=3))
    assert set(read_day(file_base, ds)["version"]) == {3}
    assert leftovers(file_base, ds) == []


def test_first_write_killed_mid_write_leaves_the_day_missing(file_base: str) -> None:
    ds = "2026-07-03"
    proc = start(PANDAS_WRITER, file_base, ds, "12000000", "2")
    kill_when(proc, staged(file_base))
    assert ds not in tables_of(file_base).days(TABLE)


SPARK_WRITER = textwrap.dedent(
    """
    import sys
    from pyspark.sql import functions as F
    from tests.helpers import tables_of
    from zipline_dagster.features.spark import SparkResource, write_days
    base, scratch = sys.argv[1], sys.argv[2]
    # its shuffle files (about 45 MB) go where the test removes them: a JVM killed with
    # SIGKILL leaves its spark.local.dir behind (by default a blockmgr-* in /tmp)
    spark = SparkResource(master="local[1]", spark_config={"spark.local.dir": scratch}).spark_session
    days = ["2026-07-01", "2026-07-02", "2026-07-03"]
    df = (spark.range(0, 3_000_000)
          .withColumn("version", F.lit(2))
          .withColumn("x", F.rand(1))
          .withColumn("ds", F.element_at(F.array(*[F.lit(d) for d in days]),
                                         (F.col("id") % 3 + 1).cast("int"))))
    write_days(df, tables_of(base), "ctr.atomic", days)
    """
)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_range_write_killed_after_staging_leaves_every_day_old(
    spark_resource: Any, file_base: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from zipline_dagster.features.spark import write_days

    days = ["2026-07-01", "2026-07-02", "2026-07-03"]
    spark = spark_resource.spark_session
    tables = tables_of(file_base)
    old = spark.createDataFrame(
        [(i, 1, float(i), d) for d in days for i in range(10)],
        "id long, version int, x double, ds string",
    )
    assert {d: x.rows for d, x in write_days(old, tables, TABLE, days).items()} == dict.fromkeys(
        days, 10
    )
    scratch = tmp_path / "spark-local"
    proc = start(SPARK_WRITER, file_base, str(scratch))
    staging = local(f"{file_base}/ctr/atomic/{STAGING_DIR}")
    try:
        kill_when(proc, lambda: staging.is_dir() and any(staging.rglob("*.parquet")), timeout=180)
        assert any(scratch.glob("blockmgr-*"))  # the killed writer's shuffle files were here
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for ds in days:
        got = read_day(file_base, ds)
        assert len(got) == 10 and set(got["version"]) == {1}, ds
    # a range re-written in one job commits every day, in one snapshot
    new = old.withColumn("version", F.lit(3)).filter(F.col("id") < 5)
    committed = write_days(new, tables_of(file_base), TABLE, days)
    assert {d: x.rows for d, x in committed.items()} == dict.fromkeys(days, 5)
    assert len({x.snapshot_id for x in committed.values()}) == 1
    for ds in days:
        assert set(read_day(file_base, ds)["version"]) == {3}
        assert leftovers(file_base, ds) == []


CONCURRENT_WRITER = textwrap.dedent(
    """
    import sys
    import pandas as pd
    from tests.helpers import write_partition
    base, days = sys.argv[1], sys.argv[2].split(",")
    for ds in days:
        write_partition(base, "ctr.atomic", ds, pd.DataFrame({"version": [int(ds[-2:])] * 5}))
    """
)


def test_two_writers_of_different_days_both_land(file_base: str) -> None:
    """Two processes committing different days of one table at the same time: every day
    lands (a commit that met the other's is retried), each with its own rows."""
    write_partition(file_base, TABLE, "2026-06-30", pd.DataFrame({"version": [0] * 5}))
    a = [f"2026-07-{d:02d}" for d in range(1, 11)]
    b = [f"2026-07-{d:02d}" for d in range(11, 21)]
    procs = [start(CONCURRENT_WRITER, file_base, ",".join(days)) for days in (a, b)]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-2000:]
    held = tables_of(file_base).days(TABLE)
    assert sorted(held) == ["2026-06-30", *a, *b]
    for ds in a + b:
        assert set(read_day(file_base, ds)["version"]) == {int(ds[-2:])}


def test_the_same_day_at_once_ends_clearly_with_one_winner(file_base: str) -> None:
    """Two writers of the same day at once: each ends (committed, or failed naming the
    day), and the day holds exactly one writer's rows."""
    ds = "2026-07-05"
    write_partition(
        file_base, TABLE, ds, pd.DataFrame({"version": [0] * 5, "x": [0.0] * 5, "y": [0.0] * 5})
    )
    procs = [start(PANDAS_WRITER, file_base, ds, "200000", str(v)) for v in (7, 8)]
    outcomes = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        outcomes.append((proc.returncode, err.decode()))
    assert any(rc == 0 for rc, _ in outcomes)
    for rc, err in outcomes:
        assert rc == 0 or ("ctr.atomic" in err and ds in err), err[-2000:]
    versions = set(read_day(file_base, ds)["version"])
    assert versions in ({7}, {8})


def test_a_day_replaced_right_after_its_commit_is_not_this_writes_to_record(
    file_base: str,
) -> None:
    """Another writer's commit of the same day lands between this write's commit and its
    read-back (a real second write, run at that moment): this write is told the day holds
    the other's rows (table, day and the other run named), and keeps the days still its."""
    from zipline_dagster.storage.tables import DaysReplaced

    days = ["2026-07-05", "2026-07-06"]
    for ds in days:
        write_partition(file_base, TABLE, ds, pd.DataFrame({"version": [0] * 5}))
    racing, other = tables_of(file_base), tables_of(file_base)
    landed = racing._try_commit

    def then_the_other_writes(*args: Any, **kwargs: Any) -> bool:
        ok = landed(*args, **kwargs)
        if ok:  # this write's commit is in: the other writer's of day 2026-07-05 follows it
            other.write_frame(TABLE, days[0], pd.DataFrame({"version": [9] * 3}), run_id="r9")
        return ok

    racing._try_commit = then_the_other_writes  # type: ignore[method-assign]
    with pytest.raises(DaysReplaced) as raised:
        racing.commit(TABLE, {ds: _staged(racing, ds, 1) for ds in days}, write_id="w1", run_id="r1")  # fmt: skip
    message = str(raised.value)
    assert "ctr.atomic" in message and "2026-07-05" in message and "run r9" in message
    assert "2026-07-06" not in message
    assert sorted(raised.value.committed) == ["2026-07-06"]
    assert raised.value.committed["2026-07-06"].write == "w1"
    assert set(read_day(file_base, "2026-07-05")["version"]) == {9}
    assert set(read_day(file_base, "2026-07-06")["version"]) == {1}


def _staged(tables: Any, ds: str, version: int) -> list[str]:
    """One staged parquet file of day ``ds`` (as a writer stages it)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    uri = f"{tables.staging_uri(TABLE, 'w1')}/_ds={ds}/part-00000.parquet"
    sink = io.BytesIO()
    pq.write_table(pa.table({"version": [version] * 4, "ds": [ds] * 4}), sink)
    tables.store.write_bytes(uri, sink.getvalue())
    return [uri]


DAGSTER_WRITER = textwrap.dedent(
    """
    import sys
    import dagster as dg
    from zipline_dagster.defs.listing_ctr_data import build_listing_views_asset
    from zipline_dagster.storage.resources import WarehouseResource
    base, ds = sys.argv[1], sys.argv[2]
    result = dg.materialize(
        [build_listing_views_asset()],
        partition_key=ds,
        resources={"warehouse": WarehouseResource(uri=base)},
        instance=dg.DagsterInstance.get(),
        raise_on_error=False,
    )
    print(result.run_id)
    sys.exit(0 if result.success else 1)
    """
)


@pytest.mark.slow
def test_the_same_day_from_two_dagster_runs_is_recorded_as_the_catalog_holds_it(
    file_base: str, tmp_path: Path
) -> None:
    """Two Dagster runs materialize the same table day at once (one instance on disk): the
    first is paused (SIGSTOP) once its rows are staged, the second runs to the end (and
    tidies what it finds staged for the day, as a killed writer's), then the first goes
    on. Both end clearly: the first fails naming the table, the day and the run whose rows
    the day holds; Dagster's latest record of the day names the snapshot and the write
    the catalog holds."""
    import dagster as dg

    from tests.helpers import in_process_dagster_home

    views, ds = "ctr.listing_views", "2026-07-05"
    home = in_process_dagster_home(tmp_path)
    env = {**os.environ, "DAGSTER_HOME": str(home)}

    def run() -> subprocess.Popen[Any]:
        return subprocess.Popen(
            [sys.executable, "-c", DAGSTER_WRITER, file_base, ds],
            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    staging = local(f"{file_base}/ctr/listing_views/{STAGING_DIR}")
    first = run()
    deadline = time.monotonic() + 120
    while not (staging.is_dir() and any(staging.rglob("*.parquet"))):  # staged, not its temp file
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.002)
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = run()
        out, err = second.communicate(timeout=180)
        assert second.returncode == 0, err.decode()[-3000:]
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    _, failed = first.communicate(timeout=180)
    assert first.returncode == 1
    held = tables_of(file_base).days(views)[ds]
    assert held.run_id == out.decode().split()[-1]  # the second run's commit holds the day
    said = f"table {views}: {ds} was written by another write (run {held.run_id} (write {held.write})) while this one ran"  # fmt: skip
    assert said in failed.decode(), failed.decode()[-3000:]
    instance = dg.DagsterInstance.from_config(str(home))
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["ctr", "listing_views"]), asset_partitions=[ds]),
        limit=5,
    ).records  # fmt: skip
    assert [r.run_id for r in records] == [held.run_id]  # the failed run recorded nothing
    latest = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}  # type: ignore[union-attr]
    assert (latest["snapshot_id"], latest["write_id"]) == (str(held.snapshot_id), held.write)
    assert leftovers(file_base, ds, views) == []


def test_reading_some_days_opens_only_the_manifests_that_may_hold_them(file_base: str) -> None:
    """A table committed a day at a time has a manifest per day: the days a window reads
    come from the manifests whose ``ds`` bounds hold them. A manifest of another day that
    cannot be read (removed here) fails a full listing, not the window's."""
    days = [f"2026-07-{d:02d}" for d in range(1, 7)]
    for ds in days:
        write_partition(file_base, TABLE, ds, pd.DataFrame({"version": [int(ds[-2:])] * 3}))
    tables = tables_of(file_base)
    whole = tables.days(TABLE)
    assert tables.days(TABLE, only=days[3:]) == {d: whole[d] for d in days[3:]}
    assert tables.state(TABLE, only=["2026-07-02", "2026-08-01"])[1] == {"2026-07-02": whole["2026-07-02"]}  # fmt: skip
    found = tables.load(TABLE)
    (first,) = [
        m for m in found.current_snapshot().manifests(found.io)
        if m.partitions[0].lower_bound == days[0].encode()
    ]  # fmt: skip
    local(first.manifest_path).unlink()
    assert sorted(tables.days(TABLE, only=days[1:])) == days[1:]
    with pytest.raises(FileNotFoundError):
        tables.days(TABLE)


def test_an_empty_day_is_committed_and_differs_from_a_missing_one(file_base: str) -> None:
    write_partition(file_base, TABLE, "2026-07-01", pd.DataFrame({"version": [1, 2]}))
    write_partition(
        file_base, TABLE, "2026-07-02", pd.DataFrame({"version": pd.Series([], dtype="int64")})
    )
    held = tables_of(file_base).days(TABLE)
    assert sorted(held) == ["2026-07-01", "2026-07-02"]
    assert held["2026-07-02"].rows == 0 and held["2026-07-02"].files == ()
    # written again with rows, the day is no longer marked empty
    write_partition(file_base, TABLE, "2026-07-02", pd.DataFrame({"version": [4]}))
    assert tables_of(file_base).days(TABLE)["2026-07-02"].rows == 1
    assert not any(
        k.startswith("zipline.empty.") for k in tables_of(file_base).load(TABLE).properties
    )


def test_rows_whose_columns_differ_from_the_table_leave_the_day_as_it_was(file_base: str) -> None:
    ds = "2026-07-01"
    write_partition(file_base, TABLE, ds, pd.DataFrame({"version": [1], "x": [0.5]}))
    with pytest.raises(SchemaMismatch) as err:
        write_partition(file_base, TABLE, ds, pd.DataFrame({"version": ["one"], "z": [0.5]}))
    message = str(err.value)
    assert "ctr.atomic" in message and "missing x" in message and "not in the table: z" in message
    assert "version is string, the table's is int64" in message
    assert set(read_day(file_base, ds)["version"]) == {1}
    assert leftovers(file_base, ds) == []


def test_a_catalog_that_cannot_be_reached_is_named_without_its_password(file_base: str) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg2://zipline:s3cr3t-pw@127.0.0.1:{port}/catalog"
    tables = tables_of(file_base, catalog_uri=url)
    with pytest.raises(CatalogError) as err:
        tables.days(TABLE)
    message = str(err.value)
    assert (
        f"SQL catalog 'zipline' at postgresql+psycopg2://zipline:***@127.0.0.1:{port}/catalog"
        in message
    )
    assert "cannot be reached" in message and "s3cr3t-pw" not in message
    assert not local(f"{file_base}/ctr").exists()  # nothing written


@pytest.mark.parametrize("store_kind", ["file", "s3", "gs", "abfss"])
def test_a_table_holds_each_committed_day_on_every_store(
    store_kind: str, request: pytest.FixtureRequest
) -> None:
    """On a local disk and on each object store's loopback server: every committed day
    with exactly its data files, in day order; a day rewritten names its new write."""
    from tests.support.training import BUCKETS
    from zipline_dagster.storage.days import days_between

    base = str(request.getfixturevalue(BUCKETS[store_kind])) + "/wh"
    days = days_between("2026-07-01", "2026-07-04")
    for i, ds in enumerate(days):
        write_partition(base, TABLE, ds, pd.DataFrame({"x": [i]}))
    tables = tables_of(base)
    first = tables.days(TABLE)
    assert list(first) == days and all(len(d.files) == 1 for d in first.values())
    assert all(d.files[0].startswith(f"{base}/ctr/atomic/data/ds={d.ds}/") for d in first.values())
    write_partition(base, TABLE, days[1], pd.DataFrame({"x": [9, 9]}))
    again = tables.days(TABLE)
    assert again[days[1]].rows == 2 and again[days[1]].write != first[days[1]].write
    assert again[days[0]].snapshot_id == first[days[0]].snapshot_id
    found = tables.load(TABLE)
    got = found.scan(row_filter=f"ds = '{days[1]}'").to_pandas()
    assert sorted(got["x"]) == [9, 9]
