"""Spark: the session resource and the computations behind GroupBy, Join and StagingQuery.

``pyspark`` is imported inside functions only: loading the code location never starts
(or imports) Spark.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from zipline_dagster.declarations.features import GroupBy, Join, Operation, StagingQuery
from zipline_dagster.errors import describe
from zipline_dagster.settings import settings, spark_master
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.days import days_between, format_days, shift_day
from zipline_dagster.storage.table_days import TableDay
from zipline_dagster.storage.tables import DaysReplaced, Tables, new_write_id

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
    # Iceberg takes microsecond timestamps, not Spark's default INT96
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
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

    Example:
        .. code-block:: python

            import dagster as dg
            from zipline_dagster.features.spark import SparkResource

            defs = dg.Definitions(
                assets=[...],
                resources={
                    "spark": SparkResource(
                        master="spark://spark-master:7077",
                        spark_config={"spark.executor.memory": "4g"},
                    )
                },
            )
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
    tables: Tables,
    table: str,
    days: Sequence[str],
    *,
    first_day: str,
    who: str,
) -> Any:
    """Rows of ``table`` for ``days`` (with a string ``ds`` column), read from exactly the
    data files of each day in the table's current Iceberg snapshot.

    Days before ``first_day`` (the partitions definition's start) do not exist and are
    skipped; any other missing day fails, naming it and what the table has.
    """
    wanted = [d for d in days if d >= first_day]
    have = tables.days(table, only=wanted)
    missing = [d for d in wanted if d not in have]
    if missing:
        have = tables.days(table)  # what it has, for the message
        raise UpstreamDataError(
            f"{who}: upstream table {table} is missing partitions {format_days(missing)}; it "
            f"has {format_days(sorted(have))}. Materialize them first."
        )
    if not wanted:
        return None
    files = [spark_path(f) for d in wanted for f in have[d].files]
    if not files:  # every wanted day was computed and had no rows
        found = tables.load(table)
        assert found is not None  # it has days
        return spark.createDataFrame([], _spark_schema(found.schema().as_arrow()))
    return spark.read.parquet(*files)


def _spark_schema(arrow_schema: Any) -> Any:
    """A Spark schema for an arrow one (an all-empty read still has the table's columns)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


class DaysNotCommitted(ProducerError):
    """The range's days could not be committed (why); each is left as it was."""

    def __init__(
        self,
        table: str,
        days: Sequence[str],
        why: str,
        committed: dict[str, TableDay] | None = None,
    ) -> None:
        self.table = table
        self.failed: dict[str, str] = {ds: why for ds in days}
        #: the range's other days, committed by this write (the same days written at once)
        self.committed: dict[str, TableDay] = committed or {}
        super().__init__(
            f"table {table}: {format_days(sorted(days))} could not be committed, so each is "
            f"left as it was: {why}"
        )


def write_days(
    df: Any,
    tables: Tables,
    table: str,
    days: Sequence[str],
    *,
    write_id: str | None = None,
    run_id: str | None = None,
    code_version: str | None = None,
) -> dict[str, TableDay]:
    """Replace exactly the days ``days`` of ``table`` (re-runs are idempotent), in one
    Iceberg commit whose snapshot names the write, the Dagster run (``run_id``) and the
    ``code_version``.

    The whole range is written by one Spark job into the table's staging folder (one file
    per day, each holding its ``ds`` column), then committed (``Tables.commit``): a crash
    at any point leaves every day old or new, never a mix. A day with no rows is
    committed empty, so "computed, no rows" differs from "never computed". Returns the
    committed days.

    Raises:
        DaysNotCommitted: the commit failed or the rows' columns differ from the table's
            (named); every day is left as it was.
    """
    from pyspark.sql import functions as F

    write_id = write_id or new_write_id()
    staging = tables.staging_uri(table, write_id)
    df = df.filter(F.col("ds").isin(list(days)))
    # one file per day, all days in one job; ds stays in the files (Iceberg's identity
    # partition reads it from the file), _ds names the folders
    df.withColumn("_ds", F.col("ds")).repartition("_ds").write.partitionBy("_ds").parquet(
        spark_path(staging)
    )
    try:
        listed = [u for u in tables.store.list(staging) if u.endswith(".parquet")]
        staged = {ds: [u for u in listed if f"/_ds={ds}/" in u] for ds in days}
        return tables.commit(
            table, staged, write_id=write_id, run_id=run_id, code_version=code_version
        )
    except DaysReplaced as exc:  # another run's write of the same days came right after
        raise DaysNotCommitted(table, sorted(exc.replaced), str(exc), exc.committed) from exc
    except (WarehouseError, BlobStorageError, OSError) as exc:  # a table's or its catalog's
        raise DaysNotCommitted(table, days, describe(exc)) from exc


def compute_group_by(
    spark: Any,
    tables: Tables,
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
        tables,
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
    spark: Any, tables: Tables, join: Join, days: Sequence[str], *, first_day: str
) -> Any:
    """Left rows of ``days`` with each GroupBy's features as of the end of the previous day."""
    from pyspark.sql import functions as F

    left = read_days(
        spark, tables, join.left.table, days, first_day=first_day, who=f"Join {join.name}"
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
            tables,
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
    tables: Tables,
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
            tables,
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
