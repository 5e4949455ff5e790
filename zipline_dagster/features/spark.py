"""Spark: the session resource and the computations behind GroupBy, Join and StagingQuery.

``pyspark`` is imported inside functions only: loading the code location never starts
(or imports) Spark.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from zipline_dagster.declarations.features import GroupBy, Join, Operation, StagingQuery
from zipline_dagster.errors import describe
from zipline_dagster.settings import settings, spark_master
from zipline_dagster.storage.blobs import BlobStorageError, BlobStore
from zipline_dagster.storage.paths import join_uri, table_partition_uri, table_uri
from zipline_dagster.storage.tables import (
    STAGING_DIR,
    begin_partition,
    commit_partition,
    committed_partitions,
    days_between,
    format_days,
    left_behind,
    new_write_id,
    shift_day,
)

#: A local session's driver: on loopback only.
LOOPBACK_DRIVER = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
DEFAULT_SPARK_CONFIG = {
    "spark.sql.session.timeZone": "UTC",
    # ds stays the string YYYY-MM-DD it is in the folder name
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    # PySpark starts its JVM as a shell, which turns the console progress bar on: it would
    # redraw itself mid-line in the demo's output and in every Spark step's captured logs
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.ansi.enabled": "false",
    "spark.log.level": "WARN",
    # warnings and errors only, without Spark's start-up banner and Hadoop's notes
    "spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile="
    + (Path(__file__).parent / "log4j2.properties").as_uri(),
}

_sessions: dict[tuple[tuple[str, str], ...], Any] = {}
_lock = threading.Lock()


class ProducerError(RuntimeError):
    """A producer cannot compute its table; the message names the producer and why."""


class UpstreamDataError(ProducerError):
    """An upstream table lacks partitions a producer needs; names them and what exists."""


class ProducerQueryError(ProducerError):
    """A producer's select expression or SQL does not analyse against its input."""


def _spark_reason(exc: BaseException) -> str:
    """The first line of Spark's error, with its class (no JVM stack trace)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def select_exprs(df: Any, selects: dict[str, str], keep: Sequence[str], *, who: str) -> Any:
    """``df.select(expr AS name, ...)`` plus the ``keep`` columns not selected.

    Raises:
        ProducerQueryError: an expression does not parse or analyse; names the producer,
            the output column, the expression and Spark's reason.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    cols = [F.expr(expr).alias(name) for name, expr in selects.items()]
    cols += [F.col(c) for c in keep if c not in selects]
    try:
        return df.select(*cols)
    except PySparkException as exc:
        for name, expr in selects.items():  # find the expression at fault
            try:
                df.select(F.expr(expr))
            except PySparkException as one:
                raise ProducerQueryError(
                    f"{who}: select {name}={expr!r} is invalid against its input (columns: "
                    f"{', '.join(df.columns)}): {_spark_reason(one)}"
                ) from one
        raise ProducerQueryError(f"{who}: its selects are invalid: {_spark_reason(exc)}") from exc


class SparkResource(dg.ConfigurableResource):
    """A Spark session built by dagster-pyspark's session builder, started on first use.

    Embedded default ``local[*]``; point ``master`` (or ``SPARK_MASTER``) at a cluster to
    scale out. Steps in one process share one session.
    """

    master: str | None = Field(
        default=None, description="Spark master URL; unset: SPARK_MASTER, else local[*]."
    )
    spark_config: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark settings (spark.executor.memory ...)."
    )

    def config(self) -> dict[str, str]:
        master = (
            spark_master(self.master, "the spark resource's master")
            or settings().spark_master
            or "local[*]"
        )
        return {
            **DEFAULT_SPARK_CONFIG,
            # a session in this process only: it listens on loopback, as the embedded Ray
            # head does, not on every address of the machine
            **(LOOPBACK_DRIVER if master.startswith("local") else {}),
            "spark.master": master,
            "spark.app.name": "zipline_dagster",
            **self.spark_config,
        }

    @property
    def spark_session(self) -> Any:
        from dagster_pyspark.resources import spark_session_from_config

        conf = self.config()
        key = tuple(sorted(conf.items()))
        with _lock:
            session = _sessions.get(key)
            if session is None or session.sparkContext._jsc is None:
                # the JVM reads it at start (it would otherwise look up the machine's
                # addresses and warn that its name resolves to loopback); set for that only
                local = (
                    conf["spark.master"].startswith("local") and "SPARK_LOCAL_IP" not in os.environ
                )
                if local:
                    os.environ["SPARK_LOCAL_IP"] = LOOPBACK_DRIVER["spark.driver.host"]
                try:
                    session = spark_session_from_config(conf)
                finally:
                    if local:
                        os.environ.pop("SPARK_LOCAL_IP", None)
                _sessions[key] = session
        return session


def spark_path(uri: str) -> str:
    """Spark reads ``file:///x`` as is; ``s3://`` goes through Hadoop's s3a connector."""
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri


def read_days(
    spark: Any,
    store: BlobStore,
    warehouse: str,
    table: str,
    days: Sequence[str],
    *,
    first_day: str,
    who: str,
) -> Any:
    """Rows of ``table`` for ``days`` (with a string ``ds`` column), read from exactly the
    files each partition's commit marker lists.

    Days before ``first_day`` (the partitions definition's start) do not exist and are
    skipped; any other missing day fails, naming it and what the table has.
    """
    wanted = [d for d in days if d >= first_day]
    have = committed_partitions(store, warehouse, table)
    missing = [d for d in wanted if d not in have]
    if missing:
        raise UpstreamDataError(
            f"{who}: upstream table {table} ({table_uri(warehouse, table)}) is missing partitions "
            f"{format_days(missing)}; it has {format_days(sorted(have))}. Materialize them first."
        )
    if not wanted:
        return None
    root = spark_path(table_uri(warehouse, table))
    files = [spark_path(f) for d in wanted for f in have[d]]
    return spark.read.option("basePath", root).parquet(*files)


class DaysNotCommitted(ProducerError):
    """Some days of a range write could not be committed (each named with why); the
    others were (``committed``: their rows), and stay committed."""

    def __init__(self, table: str, committed: dict[str, int], failed: dict[str, str]) -> None:
        self.table, self.committed, self.failed = table, committed, failed
        lines = "\n".join(f"- {ds}: {why}" for ds, why in sorted(failed.items()))
        super().__init__(
            f"table {table}: {len(failed)} of {len(committed) + len(failed)} days could not "
            f"be committed (each is left as it was; {format_days(sorted(committed))} "
            f"committed):\n{lines}"
        )


def write_days(
    df: Any,
    store: BlobStore,
    warehouse: str,
    table: str,
    days: Sequence[str],
    *,
    warn: Callable[[str], None] | None = None,
    write_id: str | None = None,
    run_id: str | None = None,
    code_version: str | None = None,
) -> dict[str, int]:
    """Replace exactly the partitions ``days`` of ``table`` (re-runs are idempotent); each
    day's marker names the write, the Dagster run (``run_id``) and the ``code_version``.

    The whole range is written by one Spark job into a staging folder, then each day is
    committed atomically (its files moved in, its marker swapped; see ``tables.py``): a
    crash at any point leaves every partition old or new, never a mix. Every day gets a
    partition, an empty one too (a schema-only file), so "the day was computed and had
    no rows" differs from "the day was never computed". Returns rows written per day.

    Raises:
        DaysNotCommitted: a day's files could not be moved in or its marker written;
            that day is left as it was, and every other day is still committed (the
            error says which), so that the caller records exactly what storage holds.
            Tidying after a commit (the replaced files, the staging folder) never fails
            the write: what is left is never read, and a later write removes it
            (``warn`` is told what was left).
    """
    from pyspark.sql import functions as F

    write_id = write_id or new_write_id()
    staging = join_uri(table_uri(warehouse, table), STAGING_DIR, write_id)
    df = df.filter(F.col("ds").isin(list(days))).persist()
    try:
        counts = {r["ds"]: int(r["count"]) for r in df.groupBy("ds").count().collect()}
        # one file per day, all days in one job
        df.repartition("ds").write.partitionBy("ds").parquet(spark_path(staging))
        if any(counts.get(d, 0) == 0 for d in days):
            df.limit(0).drop("ds").coalesce(1).write.parquet(
                spark_path(join_uri(staging, "_empty"))
            )
    finally:
        df.unpersist()
    committed: dict[str, int] = {}
    failed: dict[str, str] = {}
    for ds in days:
        folder = table_partition_uri(warehouse, table, ds)
        rows = counts.get(ds, 0)
        src = join_uri(staging, f"ds={ds}") if rows else join_uri(staging, "_empty")
        try:
            begin_partition(store, folder)
            names = []
            for i, uri in enumerate(u for u in store.list(src) if u.endswith(".parquet")):
                name = f"part-{write_id}-{i:05d}.parquet"
                if rows:
                    store.move(uri, join_uri(folder, name))
                else:  # the one schema-only file serves every empty day
                    store.write_bytes(join_uri(folder, name), store.read_bytes(uri))
                names.append(name)
            left = commit_partition(
                store,
                folder,
                names,
                write_id=write_id,
                rows=rows,
                run_id=run_id,
                code_version=code_version,
            )
        except (BlobStorageError, OSError) as exc:  # this day only; files moved in unread
            failed[ds] = (
                f"committing {folder} failed, so the partition is left as it was "
                f"({type(exc).__name__}: {describe(exc)})"
            )
            continue
        committed[ds] = rows
        if left and warn is not None:
            warn(left_behind(table, ds, left))
    try:
        for uri in store.list(staging):
            store.delete(uri)
        remove_empty_folders(staging)
    except (BlobStorageError, OSError) as exc:  # nothing reads a write's staging folder
        if warn is not None:
            warn(f"the staging folder {staging} could not be removed: {describe(exc)}")
    if failed:
        raise DaysNotCommitted(table, committed, failed)
    return committed


def remove_empty_folders(uri: str) -> None:
    """Local staging leaves empty folders behind (object stores have none)."""
    if not uri.startswith("file://"):
        return
    import shutil

    from zipline_dagster.storage.blobs import local_path

    path = local_path(uri)
    if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # _staging itself, when no other write uses it


def compute_group_by(
    spark: Any,
    store: BlobStore,
    warehouse: str,
    gb: GroupBy,
    days: Sequence[str],
    *,
    first_day: str,
) -> Any:
    """GroupBy partitions ``days``: each aggregation over days ``ds-(n-1)..ds`` per key."""
    from pyspark.sql import functions as F

    lookback = gb.lookback_days
    src_days = days_between(shift_day(days[0], -(lookback - 1)), days[-1])
    events = read_days(
        spark,
        store,
        warehouse,
        gb.source.table,
        src_days,
        first_day=first_day,
        who=f"GroupBy {gb.name}",
    )
    selects = dict(gb.source.query.selects) or None
    if events is None:
        raise UpstreamDataError(
            f"GroupBy {gb.name}: no source partitions exist for {days[0]}..{days[-1]}"
        )
    if selects:
        keep = sorted({*gb.keys, gb.source.time_column, "ds"})
        events = select_exprs(events, selects, keep, who=f"GroupBy {gb.name!r}")
    # Each event counts toward the output days ds .. ds+(lookback-1) it falls in.
    exploded = events.withColumn(
        "_out",
        F.explode(F.sequence(F.to_date("ds"), F.date_add(F.to_date("ds"), lookback - 1))),
    ).withColumn("_age", F.datediff(F.col("_out"), F.to_date("ds")))
    exploded = exploded.filter(F.col("_out").cast("string").isin(list(days)))
    aggs = []
    for agg in gb.aggregations:
        for out_col, w in agg.output_columns():
            inside = F.col("_age") < w
            value = F.when(inside, F.col(agg.input_column))
            if agg.operation is Operation.COUNT:
                expr = F.count(value)
            elif agg.operation is Operation.SUM:
                expr = F.sum(value)
            elif agg.operation is Operation.AVERAGE:
                expr = F.avg(value)
            elif agg.operation is Operation.MIN:
                expr = F.min(value)
            elif agg.operation is Operation.MAX:
                expr = F.max(value)
            else:  # LAST: the value of the latest event inside the window
                expr = F.max_by(value, F.when(inside, F.col(gb.source.time_column)))
            aggs.append(expr.alias(out_col))
    out = exploded.groupBy(*gb.keys, F.col("_out").cast("string").alias("ds")).agg(*aggs)
    return out


def compute_join(
    spark: Any, store: BlobStore, warehouse: str, join: Join, days: Sequence[str], *, first_day: str
) -> Any:
    """Left rows of ``days`` with each GroupBy's features as of the end of the previous day."""
    from pyspark.sql import functions as F

    left = read_days(
        spark, store, warehouse, join.left.table, days, first_day=first_day, who=f"Join {join.name}"
    )
    if left is None:
        raise UpstreamDataError(
            f"Join {join.name}: no left partitions exist for {days[0]}..{days[-1]}"
        )
    selects = dict(join.left.query.selects)
    if selects:
        left = select_exprs(left, selects, ["ds"], who=f"Join {join.name!r}")
    out = left
    for part in join.right_parts:
        gb = part.group_by
        mapping = dict(part.key_mapping or {k: k for k in gb.keys})
        feat_days = [shift_day(d, -1) for d in days]
        feats = read_days(
            spark,
            store,
            warehouse,
            gb.table,
            feat_days,
            first_day=first_day,
            who=f"Join {join.name}",
        )
        if feats is None:  # every needed day predates the partitions: no features yet
            for c in gb.feature_columns:
                out = out.withColumn(f"{part.prefix}{c}", F.lit(None).cast("double"))
            continue
        renamed = feats.select(
            *[F.col(gk).alias(f"_k_{lk}") for lk, gk in mapping.items()],
            # features of day d-1 serve left rows of day d
            F.date_format(F.date_add(F.to_date("ds"), 1), "yyyy-MM-dd").alias("_ds"),
            *[F.col(c).alias(f"{part.prefix}{c}") for c in gb.feature_columns],
        )
        cond = [out["ds"] == renamed["_ds"]] + [out[lk] == renamed[f"_k_{lk}"] for lk in mapping]
        out = out.join(renamed, on=cond, how="left").drop("_ds", *[f"_k_{lk}" for lk in mapping])
    return out


def compute_staging_query(
    spark: Any,
    store: BlobStore,
    warehouse: str,
    sq: StagingQuery,
    days: Sequence[str],
    *,
    first_day: str,
) -> Any:
    views = {}
    for dep in sq.dependencies:
        dep_days = days_between(shift_day(days[0], -sq.lookback_days), days[-1])
        df = read_days(
            spark,
            store,
            warehouse,
            dep,
            dep_days,
            first_day=first_day,
            who=f"StagingQuery {sq.name}",
        )
        if df is None:
            raise UpstreamDataError(
                f"StagingQuery {sq.name}: {dep} has no partitions for {days[0]}..{days[-1]}"
            )
        view = "zd_" + dep.replace(".", "__")
        df.createOrReplaceTempView(view)
        views[dep] = view
    from pyspark.errors import PySparkException

    def run(start: str, end: str) -> Any:
        sql = sq.render(start_date=start, end_date=end, table_views=views)
        try:
            return spark.sql(sql)
        except PySparkException as exc:
            raise ProducerQueryError(
                f"StagingQuery {sq.name!r}: its query is invalid ({_spark_reason(exc)}); "
                f"rendered for {start}..{end}: {' '.join(sql.split())}"
            ) from exc

    if "{{ ds }}" in sq.query and "{{ start_date }}" not in sq.query:
        # a per-day template: run it once per day of the range
        out: Any = None
        for ds in days:
            part = run(ds, ds)
            out = part if out is None else out.unionByName(part)
    else:
        out = run(days[0], days[-1])
    if "ds" not in out.columns:
        raise UpstreamDataError(
            f"StagingQuery {sq.name}: the query must return a ds column; it returned {out.columns}"
        )
    return out
