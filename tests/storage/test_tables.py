"""Atomic partitions: a writer killed half-way (kill -9, a real process) leaves every
partition as it was before, or (a first write) missing, never partial."""

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
from tests.helpers import local, write_partition
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.tables import COMMIT_NAME, STAGING_DIR, committed_partitions

TABLE = "ctr.atomic"


def read_partition(base: str, ds: str) -> pd.DataFrame:
    files = committed_partitions(blob_store(base), base, TABLE)[ds]
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
    base, ds, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(0)
    write_partition(base, "ctr.atomic", ds, pd.DataFrame(
        {"version": np.full(rows, 2), "x": rng.random(rows), "y": rng.random(rows)}))
    """
)


def start(script: str, *args: str) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def temp_file_in(folder: Path) -> Any:
    """True once an object is being written into ``folder`` (its temp file exists)."""
    return lambda: folder.is_dir() and any(p.name.endswith(".tmp") for p in folder.iterdir())


def test_pandas_writer_killed_mid_write_leaves_the_old_partition(file_base: str) -> None:
    ds = "2026-07-02"
    old = pd.DataFrame({"version": [1] * 100, "x": range(100), "y": range(100)})
    write_partition(file_base, TABLE, ds, old)
    folder = local(f"{file_base}/ctr/atomic/ds={ds}")
    proc = start(PANDAS_WRITER, file_base, ds, "12000000")
    kill_when(proc, temp_file_in(folder))
    # readers see exactly the old partition
    got = read_partition(file_base, ds)
    assert len(got) == 100 and set(got["version"]) == {1}
    # the next write commits, and the partition holds only its own data
    write_partition(file_base, TABLE, ds, old.assign(version=3))
    assert set(read_partition(file_base, ds)["version"]) == {3}
    visible = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert len(visible) == 2 and COMMIT_NAME in visible


def test_first_write_killed_mid_write_leaves_the_partition_missing(file_base: str) -> None:
    ds = "2026-07-03"
    folder = local(f"{file_base}/ctr/atomic/ds={ds}")
    proc = start(PANDAS_WRITER, file_base, ds, "12000000")
    kill_when(proc, temp_file_in(folder))
    assert ds not in committed_partitions(blob_store(file_base), file_base, TABLE)


SPARK_WRITER = textwrap.dedent(
    """
    import sys
    from pyspark.sql import functions as F
    from zipline_dagster.features.spark import SparkResource, write_days
    from zipline_dagster.storage.blobs import blob_store
    base, scratch = sys.argv[1], sys.argv[2]
    # its shuffle files (about 180 MB) go where the test removes them: a JVM killed with
    # SIGKILL leaves its spark.local.dir behind (by default a blockmgr-* in /tmp)
    spark = SparkResource(master="local[1]", spark_config={"spark.local.dir": scratch}).spark_session
    days = ["2026-07-01", "2026-07-02", "2026-07-03"]
    df = (spark.range(0, 12_000_000)
          .withColumn("version", F.lit(2))
          .withColumn("x", F.rand(1))
          .withColumn("ds", F.element_at(F.array(*[F.lit(d) for d in days]),
                                         (F.col("id") % 3 + 1).cast("int"))))
    write_days(df, blob_store(base), base, "ctr.atomic", days)
    """
)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_range_write_killed_mid_write_leaves_every_partition_old(
    spark_resource: Any, file_base: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from zipline_dagster.features.spark import write_days

    days = ["2026-07-01", "2026-07-02", "2026-07-03"]
    spark = spark_resource.spark_session
    store = blob_store(file_base)
    old = spark.createDataFrame(
        [(i, 1, float(i), d) for d in days for i in range(10)],
        "id long, version int, x double, ds string",
    )
    assert write_days(old, store, file_base, TABLE, days) == dict.fromkeys(days, 10)
    staging = local(f"{file_base}/ctr/atomic/{STAGING_DIR}")
    scratch = tmp_path / "spark-local"
    proc = start(SPARK_WRITER, file_base, str(scratch))
    try:
        kill_when(proc, lambda: staging.is_dir() and any(staging.rglob("*.parquet")), timeout=180)
        assert any(scratch.glob("blockmgr-*"))  # the killed writer's shuffle files were here
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for ds in days:
        got = read_partition(file_base, ds)
        assert len(got) == 10 and set(got["version"]) == {1}, ds
    # a range re-written in one job commits every day
    new = old.withColumn("version", F.lit(3)).filter(F.col("id") < 5)
    assert write_days(new, store, file_base, TABLE, days) == dict.fromkeys(days, 5)
    for ds in days:
        assert set(read_partition(file_base, ds)["version"]) == {3}


def test_a_table_is_listed_once_per_run(file_base: str) -> None:
    """Inside one step (``one_listing_per_table``) every read of a table reuses the first
    listing; outside it each call lists again and sees new partitions."""
    from zipline_dagster.storage.blobs import LocalStore
    from zipline_dagster.storage.tables import one_listing_per_table

    class CountingStore(LocalStore):  # the real local store, counting its listings
        listings = 0

        def list(self, prefix_uri: str) -> list[str]:
            CountingStore.listings += 1
            return super().list(prefix_uri)

    store = CountingStore()
    frame = pd.DataFrame({"x": [1, 2]})
    write_partition(file_base, "ns.t", "2026-07-01", frame)
    with one_listing_per_table():
        first = committed_partitions(store, file_base, "ns.t")
        again = committed_partitions(store, file_base, "ns.t")
        assert again == first and sorted(first) == ["2026-07-01"]
        assert CountingStore.listings == 1
    write_partition(file_base, "ns.t", "2026-07-02", frame)
    assert sorted(committed_partitions(store, file_base, "ns.t")) == ["2026-07-01", "2026-07-02"]
    assert CountingStore.listings == 2


@pytest.mark.parametrize("store_kind", ["file", "s3", "gs", "abfss"])
def test_a_listing_names_each_committed_partition_with_its_files(
    store_kind: str, request: pytest.FixtureRequest
) -> None:
    """A table's listing: every committed day with exactly the files its marker lists, in
    day order, whatever order an object store's marker reads (several at a time) came back
    in; a first write still in progress is missing; a folder without a marker (another
    system's) is all its parquet files. On a local disk and on each object store's server."""
    from tests.training.test_assets import BUCKETS
    from zipline_dagster.storage.tables import begin_partition, days_between

    base = str(request.getfixturevalue(BUCKETS[store_kind])) + "/wh"
    store = blob_store(base)
    days = days_between("2026-07-01", "2026-07-12")
    written = {
        ds: write_partition(base, TABLE, ds, pd.DataFrame({"x": [i]}))
        for i, ds in enumerate(days[:10])
    }
    root = f"{base}/ctr/atomic"
    begin_partition(store, f"{root}/ds={days[10]}")  # a first write under way
    store.write_bytes(f"{root}/ds={days[11]}/part-0.parquet", b"not read here")
    store.write_bytes(f"{root}/ds={days[11]}/_SUCCESS", b"")
    listed = committed_partitions(store, base, TABLE)
    assert list(listed) == [*days[:10], days[11]]
    assert {ds: listed[ds] for ds in days[:10]} == {ds: [written[ds]] for ds in days[:10]}
    assert listed[days[11]] == [f"{root}/ds={days[11]}/part-0.parquet"]


def test_a_commit_whose_replaced_files_cannot_be_deleted_is_still_committed(
    s3_bucket: str,
) -> None:
    """On S3 as a role allowed to write but not to delete (the loopback server behind a
    proxy that answers every DELETE with S3's 403, a real refusal on the wire): the marker
    swap commits the partition, readers see exactly the new data, and the file it
    replaced stays (never read) and is named; the partition's next commit, allowed to
    delete, removes it."""
    import io

    from tests.helpers import s3_through_proxy
    from zipline_dagster.storage.paths import join_uri, table_partition_uri
    from zipline_dagster.storage.tables import commit_partition

    base, ds = f"{s3_bucket}/wh", "2026-07-02"
    with s3_through_proxy() as proxy:
        store = blob_store(base)
        folder = table_partition_uri(base, TABLE, ds)

        def commit(version: int) -> tuple[list[str], str]:
            buf = io.BytesIO()
            pd.DataFrame({"version": [version] * 3}).to_parquet(buf, index=False)
            new = join_uri(folder, f"part-v{version}.parquet")
            store.write_bytes(new, buf.getvalue())
            name = new.rsplit("/", 1)[1]
            return commit_partition(store, folder, [name], write_id=f"v{version}", rows=3), new

        def read() -> set[int]:
            (only,) = committed_partitions(store, base, TABLE)[ds]
            return set(pd.read_parquet(io.BytesIO(store.read_bytes(only)))["version"])

        write_partition(base, TABLE, ds, pd.DataFrame({"version": [1] * 3}))
        (old,) = committed_partitions(store, base, TABLE)[ds]
        proxy.deny("DELETE")
        left, v2 = commit(2)
        assert proxy.denied >= 1
        assert left == [old]  # named, not lost
        assert read() == {2}  # committed: readers see the new data alone
        assert set(store.list(folder)) == {join_uri(folder, COMMIT_NAME), old, v2}
        proxy.restore()
        left, v3 = commit(3)
        assert left == [] and read() == {3}
        assert set(store.list(folder)) == {join_uri(folder, COMMIT_NAME), v3}
