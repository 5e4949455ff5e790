"""The warehouse on Iceberg, against what it replaces, in the same run:

- a 30-day Spark range committed to an Iceberg table (staged, moved in, one commit)
  against a plain parquet write of the same rows (``partitionBy("ds")``, no commit);
- a trainer's window read (files planned by pyiceberg at a snapshot, then read) against
  reading the same files with pyarrow straight away;
- planning a window (resolving its days to their snapshot and files, as a training step
  does) on a table of 120 days each rewritten 3 times, a commit at a time, before and
  after ``warehouse_maintenance`` (the goal's 365 days take too long to build: see there).
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from zipline_runtime import trainer_io as tio

from tests.bench.record import Case, Series, record, repeat
from tests.helpers import tables_of
from zipline_dagster.storage.days import days_between, shift_day
from zipline_dagster.storage.maintenance import maintain
from zipline_dagster.storage.table_days import window_snapshot

pytestmark = [pytest.mark.bench, pytest.mark.spark]
REPEATS = 3
DAYS = days_between("2026-06-01", "2026-06-30")
#: a small window, and one of a size a trainer reads (the commit's and the planning's
#: costs are fixed: their share falls as the data grows)
SIZES = [20_000, 200_000]


def frame(spark: Any, version: int, rows_per_day: int) -> Any:
    from pyspark.sql import functions as F

    days = F.array(*[F.lit(d) for d in DAYS])
    return (
        spark.range(0, rows_per_day * len(DAYS))
        .withColumn("ds", F.element_at(days, (F.col("id") % len(DAYS) + 1).cast("int")))
        .withColumn("x", F.rand(version))
        .withColumn("y", F.randn(version))
        .withColumn("version", F.lit(version))
    )


@pytest.mark.parametrize("rows_per_day", SIZES)
def test_a_spark_range_committed_to_iceberg_against_a_plain_parquet_write(
    spark_resource: Any, tmp_path: Path, rows_per_day: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The goal is on the commit (its time inside ``write_days``: files moved in, one
    Iceberg commit, the tidy) against the Spark write it follows. The whole write is
    shown beside it: its files also hold ``ds``, which the plain write's folders carry
    instead (Iceberg's spec wants every column in the data files; engines that do not
    project identity partitions read a file without it as null)."""
    from zipline_dagster.features.spark import spark_path, write_days
    from zipline_dagster.storage.tables import Tables

    spark = spark_resource.spark_session
    base = (tmp_path / "wh").as_uri()
    tables = tables_of(base)
    commits: list[float] = []
    commit = Tables.commit

    def timed(self: Tables, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return commit(self, *args, **kwargs)
        finally:
            commits.append(time.perf_counter() - t0)

    monkeypatch.setattr(Tables, "commit", timed)
    plain: list[float] = []
    iceberg: list[float] = []
    for n in range(REPEATS):  # interleaved, so drift hits both alike
        df = frame(spark, n, rows_per_day).cache()
        df.count()
        out = tmp_path / f"plain-{n}"
        t0 = time.perf_counter()
        df.repartition("ds").write.partitionBy("ds").parquet(spark_path(out.as_uri()))
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        committed = write_days(df, tables, "bench.range", DAYS)
        iceberg.append(time.perf_counter() - t0)
        assert sum(d.rows for d in committed.values()) == rows_per_day * len(DAYS)
        df.unpersist()
        shutil.rmtree(out)
    spark_write = Series("", [i - c for i, c in zip(iceberg, commits, strict=True)]).median
    share = Series("", commits).median / spark_write
    whole = Series("", iceberg).median / Series("", plain).median - 1
    record(
        Case(
            name=f"a {len(DAYS)}-day Spark range ({rows_per_day:,} rows a day) committed to "
            "an Iceberg table",
            baseline=Series("plain parquet write", plain),
            measured=Series("Iceberg: staged, moved in, one commit", iceberg),
            goal="commit overhead <= 10% of the Spark write",
            value=share,
            value_text=f"commit {Series('', commits).median * 1000:.0f} ms, {share * 100:.0f}% "
            f"of the write; whole write {whole * 100:+.0f}% against plain",
            met=share <= 0.10,
            notes=[
                f"{rows_per_day:,} rows a day (4 columns), local Spark (2 cores), file:// "
                "warehouse, SQLite catalog; the same cached frame for both writes; the whole "
                "write's extra beyond the commit is the ds column in every file (the spec's)"
            ],
        )
    )


@pytest.mark.parametrize("maintained", [False, True], ids=["daily commits", "maintained"])
@pytest.mark.parametrize("rows_per_day", SIZES)
def test_a_trainers_window_read_against_reading_its_files_with_pyarrow(
    tmp_path: Path, rows_per_day: int, maintained: bool
) -> None:
    """The window's 30 days were committed one a day (30 manifests to plan from), or
    then compacted by ``warehouse_maintenance`` (one): the trainer's planning reads each
    manifest, about 0.2 ms apiece here (0.9 ms with pyiceberg's own reading, which derives
    every manifest file's Avro schema and reader again)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.helpers import write_partition
    from tests.support.fanout import market_rows

    base = (tmp_path / "wh").as_uri()
    table = "bench.window"
    for ds in DAYS:
        write_partition(base, table, ds, market_rows(ds, 50, rows_per_day // 50))
    tables = tables_of(base)
    if maintained:
        assert maintain(tables, table, retain=dt.timedelta(0)) is not None
    metadata, held = tables.state(table)
    snapshot = window_snapshot(held, DAYS)
    files = [tio.filesystem(f)[1] for d in DAYS for f in held[d].files]
    columns = ["market", "price", "label"]

    def planned() -> None:
        window = tio.WindowFiles(
            base, table, DAYS, "ds", columns, metadata=metadata, snapshot_id=snapshot
        )
        assert window.read_table(columns).num_rows == len(DAYS) * rows_per_day

    def straight() -> None:
        read = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
        assert read.num_rows == len(DAYS) * rows_per_day

    def plan_only() -> None:
        tio.plan_window(metadata, snapshot, DAYS, "ds")

    planned(), straight()  # warm
    theirs, ours, plans = [], [], []
    # each sample: the mean of 7 reads of each arm, taken in turns (a read is tens of ms,
    # and this machine's speed drifts over seconds)
    for _ in range(max(REPEATS, 5)):
        sample: dict[Any, float] = {straight: 0.0, planned: 0.0, plan_only: 0.0}
        for _ in range(7):
            for arm in sample:
                sample[arm] += _mean_of(arm, 1) / 7
        theirs.append(sample[straight])
        ours.append(sample[planned])
        plans.append(sample[plan_only])
    ratio = Series("", ours).median / Series("", theirs).median
    manifests = _manifests(tables, table)
    record(
        Case(
            name=f"a trainer's window of {len(DAYS)} days ({rows_per_day:,} rows a day) read, "
            + ("after warehouse_maintenance" if maintained else "committed a day at a time"),
            baseline=Series("the same files read with pyarrow", theirs),
            measured=Series("planned by pyiceberg at its snapshot, then read", ours),
            goal="<= 1.2x",
            value=ratio,
            value_text=f"{ratio:.2f}x",
            met=ratio <= 1.2,
            notes=[
                f"{len(DAYS)} files of {rows_per_day:,} rows (3 of 4 columns read), file://; "
                "read_table also appends the day as a dictionary column; each sample the "
                "mean of 7 reads of each arm, in turns",
                f"planning alone (the snapshot's manifests, {manifests} here, read with "
                f"pyiceberg's Avro reader, kept per manifest schema): "
                f"{Series('', plans).median * 1000:.1f} ms, a fixed cost per manifest "
                "whatever the rows",
            ],
        )
    )


def _commit_range(tables: Any, table: str, days: list[str], value: int) -> None:
    """Replace ``days`` in one commit (as a Spark range or a backfill does)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from zipline_dagster.storage.days import DAY
    from zipline_dagster.storage.paths import join_uri
    from zipline_dagster.storage.tables import new_write_id

    write_id = new_write_id()
    staged = {}
    for ds in days:
        uri = join_uri(tables.staging_uri(table, write_id), f"_{DAY}={ds}", "part-00000.parquet")
        sink = io.BytesIO()
        pq.write_table(pa.table({"ds": [ds], "x": [value]}), sink)
        tables.store.write_bytes(uri, sink.getvalue())
        staged[ds] = [uri]
    tables.commit(table, staged, write_id=write_id)


def test_planning_a_window_on_a_year_rewritten_three_times(tmp_path: Path) -> None:
    """A year written three times: twice by 30-day range commits (backfills), then a day
    at a time (the daily schedule), so the current snapshot has a manifest per day."""
    import pandas as pd

    base = (tmp_path / "wh").as_uri()
    table = "bench.year"
    tables = tables_of(base)
    year = days_between("2025-07-01", shift_day("2025-07-01", 364))
    for rewrite in range(2):
        for start in range(0, len(year), 30):
            _commit_range(tables, table, year[start : start + 30], rewrite)
    for ds in year:
        tables.write_frame(table, ds, pd.DataFrame({"x": [2]}))
    window = year[-30:]
    manifests = _manifests(tables, table)

    def plan() -> None:  # as a training step plans its window (``Tables.state``)
        _, held = tables.state(table, only=window)
        assert all(d in held for d in window)
        window_snapshot(held, window)

    plan()
    before = repeat(plan)
    done = maintain(tables, table, retain=dt.timedelta(0))
    assert done is not None
    after = repeat(plan)
    record(
        Case(
            name="planning a window on a table of 365 days each written 3 times",
            baseline=Series("before maintenance", before),
            measured=Series("after warehouse_maintenance", after),
            goal="<= 200 ms after maintenance",
            value=Series("after", after).median,
            value_text=f"{Series('after', after).median * 1000:.0f} ms",
            met=Series("after", after).median <= 0.2,
            notes=[
                "written twice by 30-day range commits, then a day at a time "
                f"({manifests} manifests in the current snapshot); "
                + done.describe()
                + "; SQLite catalog, file://"
            ],
        )
    )


def _mean_of(fn: Any, times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - start) / times


def _manifests(tables: Any, table: str) -> int:
    found = tables.load(table)
    return len(found.current_snapshot().manifests(found.io))
