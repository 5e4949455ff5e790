"""GroupBy / Join / StagingQuery on a real local Spark session, checked against pandas."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers import partition_writes, tables_of, write_partition
from zipline_dagster.declarations.features import (
    Aggregation,
    EventTable,
    GroupBy,
    Join,
    JoinPart,
    Operation,
    StagingQuery,
)
from zipline_dagster.declarations.model import Query, Window
from zipline_dagster.features.spark import (
    UpstreamDataError,
    compute_group_by,
    compute_join,
    compute_staging_query,
    write_days,
)
from zipline_dagster.storage.days import days_between

pytestmark = pytest.mark.spark
FIRST = "2026-07-01"

# Hand-made events. Listing 3 only has events on the label day and later: none may leak.
EVENTS = [
    # ds, listing_id, ts (hour), clicked, price, inventory
    ("2026-07-01", 1, 1, 1, 10.0, 5),
    ("2026-07-01", 2, 2, 0, 20.0, 7),
    ("2026-07-02", 1, 3, 0, 12.0, 4),
    ("2026-07-02", 1, 9, 1, 14.0, 3),
    ("2026-07-03", 2, 4, 1, 22.0, 6),
    ("2026-07-03", 1, 5, 0, 11.0, 9),
    ("2026-07-04", 1, 6, 1, 99.0, 99),  # label day: must not reach features for 07-04 rows
    ("2026-07-04", 3, 7, 1, 50.0, 1),
    ("2026-07-05", 2, 8, 1, 77.0, 77),  # the future
]

GB = GroupBy(
    name="listing_stats",
    table="ctr.listing_stats",
    source=EventTable(table="ctr.views"),
    keys=["listing_id"],
    aggregations=[
        Aggregation("clicked", Operation.SUM, [Window(1), Window(3)]),
        Aggregation("clicked", Operation.COUNT, [Window(3)]),
        Aggregation("price", Operation.AVERAGE, [Window(3)]),
        Aggregation("inventory", Operation.LAST, [Window(3)]),
        Aggregation("price", Operation.MAX, [Window(2)]),
    ],
)


def events_frame() -> pd.DataFrame:
    df = pd.DataFrame(EVENTS, columns=["ds", "listing_id", "hour", "clicked", "price", "inventory"])
    df["ts"] = pd.to_datetime(df["ds"]) + pd.to_timedelta(df["hour"], unit="h")
    return df.drop(columns="hour")


def write_events(base: str) -> None:
    df = events_frame()
    for ds in days_between(FIRST, "2026-07-05"):
        write_partition(
            base, "ctr.views", ds, df[df.ds == ds].drop(columns="ds").reset_index(drop=True)
        )


def pandas_group_by(df: pd.DataFrame, day: str) -> pd.DataFrame:
    """Independent reference: per key, aggregations over days day-(w-1)..day."""
    d = dt.date.fromisoformat(day)
    rows = []
    ev = df.assign(_d=pd.to_datetime(df["ds"]).dt.date)
    in_longest = ev[(ev._d <= d) & (ev._d > d - dt.timedelta(days=3))]
    for key in sorted(in_longest.listing_id.unique()):
        k = ev[ev.listing_id == key]

        def win(w: int, k: pd.DataFrame = k) -> pd.DataFrame:
            return k[(k._d <= d) & (k._d > d - dt.timedelta(days=w))]

        last3 = win(3).sort_values("ts")
        rows.append(
            {
                "listing_id": key,
                "ds": day,
                "clicked_sum_1d": win(1).clicked.sum() if len(win(1)) else np.nan,
                "clicked_sum_3d": win(3).clicked.sum(),
                "clicked_count_3d": len(win(3)),
                "price_avg_3d": win(3).price.mean(),
                "inventory_last_3d": last3.inventory.iloc[-1],
                "price_max_2d": win(2).price.max() if len(win(2)) else np.nan,
            }
        )
    return pd.DataFrame(rows)


def to_pandas(df: Any) -> pd.DataFrame:
    return df.toPandas().sort_values(["ds", "listing_id"]).reset_index(drop=True)


def test_a_local_session_listens_on_loopback_only(spark_resource: Any) -> None:
    """The embedded (local) session is reachable from this machine only, as the embedded
    Ray head is: its driver answers on 127.0.0.1, not on the machine's outward address."""
    import socket

    conf = spark_resource.spark_session.sparkContext.getConf()
    port = int(conf.get("spark.driver.port"))
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # sends nothing: the address a route out uses
            outward = probe.getsockname()[0]
    except OSError:
        outward = "127.0.0.1"  # no route out: loopback is the machine's only address
    if not outward.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((outward, port), timeout=5).close()


def test_the_test_runs_spark_jvms_compile_with_c1_and_the_products_default_is_untouched(
    spark_resource: Any,
) -> None:
    """The suite's Spark JVMs run C1 only (``SPARK_SUBMIT_OPTS``, set in
    tests/conftest.py and inherited by every process the tests start), keeping the
    session's quiet log4j settings; the product's own Spark settings do not set it."""
    from tests.conftest import C1_ONLY
    from zipline_dagster.features.spark import SparkResource

    jvm = spark_resource.spark_session.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert C1_ONLY in args, args
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in args), args
    assert not any(C1_ONLY in v for v in SparkResource(master="local[2]").config().values())


def test_group_by_matches_pandas(spark_resource: Any, file_base: str) -> None:
    write_events(file_base)
    spark = spark_resource.spark_session
    days = ["2026-07-02", "2026-07-03", "2026-07-04"]
    got = to_pandas(compute_group_by(spark, tables_of(file_base), GB, days, first_day=FIRST))
    want = pd.concat([pandas_group_by(events_frame(), d) for d in days], ignore_index=True)
    want = want.sort_values(["ds", "listing_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)


def test_join_is_point_in_time_correct(spark_resource: Any, file_base: str) -> None:
    write_events(file_base)
    store = tables_of(file_base)
    spark = spark_resource.spark_session
    feature_days = days_between(FIRST, "2026-07-04")
    write_days(
        compute_group_by(spark, store, GB, feature_days, first_day=FIRST),
        store,
        GB.table,
        feature_days,
    )

    join = Join(
        name="training",
        table="ctr.training",
        left=EventTable(
            table="ctr.views", query=Query(selects={"listing_id": "listing_id", "label": "clicked"})
        ),
        right_parts=[JoinPart(group_by=GB)],
    )
    got = to_pandas(compute_join(spark, store, join, ["2026-07-04", "2026-07-05"], first_day=FIRST))
    ref_features = pd.concat(
        [pandas_group_by(events_frame(), d) for d in ["2026-07-03", "2026-07-04"]]
    )
    ref_features["ds"] = ref_features["ds"].map(
        lambda d: (dt.date.fromisoformat(d) + dt.timedelta(days=1)).isoformat()
    )
    left = events_frame()
    left = left[left.ds.isin(["2026-07-04", "2026-07-05"])][["listing_id", "clicked", "ds"]].rename(
        columns={"clicked": "label"}
    )
    want = (
        left.merge(ref_features, on=["listing_id", "ds"], how="left")
        .sort_values(["ds", "listing_id"])
        .reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)

    row = got[(got.ds == "2026-07-04") & (got.listing_id == 1)].iloc[0]
    # as of the end of 07-03: the 07-04 price 99 / inventory 99 must not leak in
    assert row.price_avg_3d == pytest.approx((10 + 12 + 14 + 11) / 4)
    assert row.inventory_last_3d == 9
    new_listing = got[(got.ds == "2026-07-04") & (got.listing_id == 3)].iloc[0]
    assert pd.isna(new_listing.clicked_sum_3d)  # only events on or after its label day
    future = got[(got.ds == "2026-07-05") & (got.listing_id == 2)].iloc[0]
    assert future.clicked_sum_3d == 1 and future.price_max_2d != 77.0


def test_staging_query_writes_each_day_idempotently(spark_resource: Any, file_base: str) -> None:
    write_events(file_base)
    store = tables_of(file_base)
    spark = spark_resource.spark_session
    sq = StagingQuery(
        name="labels",
        table="ctr.labels",
        query="SELECT listing_id, clicked AS label, ds FROM ctr.views WHERE ds BETWEEN '{{ start_date }}' AND '{{ end_date }}'",
        dependencies=["ctr.views"],
    )
    days = ["2026-07-02", "2026-07-03"]
    counts = write_days(
        compute_staging_query(spark, store, sq, days, first_day=FIRST),
        store,
        sq.table,
        days,
    )
    assert {d: x.rows for d, x in counts.items()} == {"2026-07-02": 2, "2026-07-03": 2}
    again = write_days(
        compute_staging_query(spark, store, sq, days, first_day=FIRST),
        store,
        sq.table,
        days,
    )
    assert {d: x.rows for d, x in again.items()} == {"2026-07-02": 2, "2026-07-03": 2}
    found = store.load("ctr.labels")
    assert len(found.scan(row_filter="ds = '2026-07-02'").to_arrow()) == 2  # replaced, not appended


def test_missing_upstream_partition_is_named(spark_resource: Any, file_base: str) -> None:
    write_partition(
        file_base, "ctr.views", "2026-07-01", events_frame().iloc[:1].drop(columns="ds")
    )
    with pytest.raises(UpstreamDataError) as exc:
        compute_group_by(
            spark_resource.spark_session,
            tables_of(file_base),
            GB,
            ["2026-07-03"],
            first_day=FIRST,
        )
    assert "missing partitions 2026-07-02..2026-07-03" in str(
        exc.value
    ) and "it has 2026-07-01" in str(exc.value)


@pytest.mark.parametrize(
    ("producer_kind", "fragment"),
    [
        ("group_by", "GroupBy 'bad_stats': select price_log='ln(pricee)' is invalid"),
        ("join", "Join 'bad_join': select price_log='ln(pricee)' is invalid"),
        ("staging", "StagingQuery 'bad_sq': its query is invalid"),
    ],
)
def test_bad_select_expression_names_producer_and_expression(
    spark_resource: Any, tmp_path: Any, producer_kind: str, fragment: str
) -> None:
    """Materialized through Dagster: a clean Failure naming the producer and expression,
    with Spark's reason, not a JVM stack trace."""
    import dagster as dg

    from zipline_dagster.features.assets import build_producer_asset
    from zipline_dagster.storage.resources import WarehouseResource

    base = (tmp_path / "wh").as_uri()
    write_events(base)
    bad = Query(selects={"price_log": "ln(pricee)", "listing_id": "listing_id"})
    producer: Any
    if producer_kind == "group_by":
        producer = GroupBy(
            name="bad_stats",
            table="ctr.bad_stats",
            source=EventTable(table="ctr.views", query=bad),
            keys=["listing_id"],
            aggregations=[Aggregation("price_log", Operation.SUM, [Window(1)])],
        )
    elif producer_kind == "join":
        producer = Join(
            name="bad_join",
            table="ctr.bad_join",
            left=EventTable(table="ctr.views", query=bad),
            right_parts=[JoinPart(group_by=GB)],
        )
    else:
        producer = StagingQuery(
            name="bad_sq",
            table="ctr.bad_sq",
            query="SELECT listing_id, pricee, ds FROM ctr.views WHERE ds = '{{ ds }}'",
            dependencies=["ctr.views"],
        )
    result = dg.materialize(
        [build_producer_asset(producer)],
        partition_key="2026-07-03",
        resources={"spark": spark_resource, "warehouse": WarehouseResource(uri=base)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    err = result.get_step_failure_events()[0].step_failure_data.error
    assert err is not None and err.cls_name == "Failure", err
    text = err.message
    assert fragment in text, text
    assert "AnalysisException" in text or "ParseException" in text
    assert "at org.apache.spark" not in text  # no JVM stack trace


def test_a_long_stage_writes_no_progress_bar_to_the_console(tmp_path: Any) -> None:
    """PySpark starts its JVM as a shell, which turns Spark's console progress bar on: a
    stage over half a second redraws ``[Stage 0:> (0 + 1) / 1]`` on stderr, which ends up
    mid-line in the demo's output and in every Spark step's captured logs in the UI. The
    session the platform builds leaves it off. (A fresh process: the JVM writes to the
    stderr it was started with, which a test in this process cannot capture.)"""
    import subprocess
    import sys

    script = (
        "import time\n"
        "from zipline_dagster.features.spark import SparkResource\n"
        "spark = SparkResource(master='local[1]').spark_session\n"
        "assert spark.sparkContext.range(1).map(lambda x: time.sleep(2) or x).sum() == 0\n"
        "spark.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[Stage" not in done.stderr, done.stderr[-2000:]


def test_a_range_that_cannot_be_committed_leaves_every_day_as_it_was(
    spark_resource: Any, tmp_path: Any
) -> None:
    """A producer's range run (one Spark job, one Iceberg commit for its days) in which
    one day's files cannot be moved into the table (its data folder's path is taken by a
    stray file: a real write that fails): no day is committed, the step fails naming the
    days and why, Dagster records none of them, and nothing of the write is left in the
    table; once the path is free, the range commits, each day materialized with its rows
    and the write and run its snapshot names. A day written again on storage by a write
    Dagster never recorded (a run stopped between its commit and its record) is recorded
    from storage by the planner, which then finds it fresh."""
    import dagster as dg

    from tests.helpers import local, run_days
    from zipline_dagster.features.assets import build_producer_asset
    from zipline_dagster.features.spark import write_days
    from zipline_dagster.lineage.freshness import FreshnessResolver
    from zipline_dagster.storage.resources import WarehouseResource

    base = (tmp_path / "wh").as_uri()
    write_events(base)
    sq = StagingQuery(
        name="labels",
        table="ctr.labels",
        query="SELECT listing_id, clicked AS label, ds FROM ctr.views WHERE ds BETWEEN '{{ start_date }}' AND '{{ end_date }}'",
        dependencies=["ctr.views"],
    )
    asset = build_producer_asset(sq)
    defs = dg.Definitions(
        assets=[asset],
        resources={"spark": spark_resource, "warehouse": WarehouseResource(uri=base)},
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    blocked = local(f"{base}/ctr/labels/data/ds=2026-07-03")
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a day's folder")

    result = run_days(job, instance, asset.key, "2026-07-02", "2026-07-04")
    assert not result.success
    err = result.get_step_failure_events()[0].step_failure_data.error
    assert err is not None and err.cls_name == "Failure"
    assert "3 of 3 partitions of ctr.labels failed (0 committed and materialized)" in err.message
    assert "- 2026-07-03: table ctr.labels: moving file:///" in err.message, err.message
    assert "2026-07-02..2026-07-04 left as they were" in err.message
    assert f"File exists ({blocked})" in err.message or "Not a directory" in err.message, (
        err.message
    )
    tables = tables_of(base)
    assert tables.days("ctr.labels") == {}  # Dagster and storage agree: nothing
    assert not instance.fetch_materializations(asset.key, limit=10).records
    data = local(f"{base}/ctr/labels/data")
    assert [p.name for p in data.rglob("*") if p.is_file()] == [blocked.name]  # nothing moved in

    def recorded(what: str = "rows") -> dict[str, Any]:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset.key), limit=100
        ).records
        out = {}
        for r in records:
            m = r.asset_materialization
            assert m is not None and m.partition is not None
            out.setdefault(m.partition, m.metadata[what].value)
        return out

    blocked.unlink()
    assert run_days(job, instance, asset.key, "2026-07-02", "2026-07-04").success
    assert recorded() == {"2026-07-02": 2, "2026-07-03": 2, "2026-07-04": 2}
    assert sorted(tables.days("ctr.labels")) == ["2026-07-02", "2026-07-03", "2026-07-04"]
    writes = recorded("write_id")
    assert writes == partition_writes(base, "ctr.labels")
    held = tables.days("ctr.labels")["2026-07-03"]
    assert held.run_id == instance.get_runs(limit=1)[0].run_id
    assert recorded("snapshot_id")["2026-07-03"] == str(held.snapshot_id)
    assert recorded("dagster/table_name")["2026-07-03"] == "ctr.labels"
    graph = defs.resolve_asset_graph()
    assert FreshnessResolver(instance, graph).status(asset.key, "2026-07-02").fresh

    frame = spark_resource.spark_session.createDataFrame(
        [(7, 1, "2026-07-02")], "listing_id long, label long, ds string"
    )
    write_days(
        frame,
        tables,
        "ctr.labels",
        ["2026-07-02"],
        write_id="unrecorded-1",
        code_version=graph.get(asset.key).code_version,  # the producer's own, as a run's
    )
    resolver = FreshnessResolver(instance, graph)
    assert resolver.status(asset.key, "2026-07-02").fresh
    assert [d.describe() for d in resolver.ledger.recorded] == [
        f"storage holds write unrecorded-1, committed by no Dagster run, which ended without "
        f"recording it (Dagster had write {writes['2026-07-02']} (run "
        f"{instance.get_runs(limit=1)[0].run_id})): recorded from storage"
    ]
    assert recorded("write_id")["2026-07-02"] == "unrecorded-1"
    assert FreshnessResolver(instance, graph).status(asset.key, "2026-07-04").fresh


def test_a_model_trains_on_a_table_day_recorded_from_storage(
    spark_resource: Any, file_base: str
) -> None:
    """The training table is a Spark producer's. One of a model partition's window days
    is committed again by a write Dagster never recorded (a producer run stopped between
    its commit and its record; here a real Spark write of the day under a write id no
    materialization names): the model partition records the day into Dagster from
    storage, says so, and trains on it, so that what it trained on is what Dagster
    records."""
    import dagster as dg

    from tests.conftest import TRAINERS
    from tests.helpers import ctr_rows, days_ending, run_days
    from tests.support.training import TABLE, make_model, resources
    from zipline_dagster.definitions import ExternalTable, build_definitions
    from zipline_dagster.features.spark import write_days
    from zipline_dagster.jobs.archive import publish_trainer_archive
    from zipline_dagster.lineage.partitions import latest_materialization

    raw, ds = "ctr.raw_views", "2026-07-10"
    window = days_ending(ds, 4)
    for day in window:
        write_partition(file_base, raw, day, ctr_rows(day, 300))
    producer = StagingQuery(
        name="training_v1",
        table=TABLE,
        query=f"SELECT * FROM {raw} WHERE ds BETWEEN '{{{{ start_date }}}}' AND '{{{{ end_date }}}}'",
        dependencies=[raw],
    )
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    defs = build_definitions(
        external_tables=[ExternalTable(raw)],
        producers=[producer],
        models=[model],
        resources={**resources(None, file_base), "spark": spark_resource},
        automation=False,
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    table_key, model_key = dg.AssetKey(TABLE.split(".")), dg.AssetKey(["models", model.name])
    assert run_days(job, instance, table_key, window[0], window[-1]).success
    recorded = partition_writes(file_base, TABLE)[window[1]]

    frame = spark_resource.spark_session.createDataFrame(
        ctr_rows(window[1], 300, seed=1).assign(ds=window[1])
    )
    write_days(frame, tables_of(file_base), TABLE, [window[1]], write_id="unrecorded-1")
    trained = job.execute_in_process(
        instance=instance, asset_selection=[model_key], partition_key=ds
    )
    assert trained.success
    record = latest_materialization(instance, table_key, window[1])
    assert record is not None and record.asset_materialization is not None
    md = record.asset_materialization.metadata
    assert md["write_id"].value == "unrecorded-1"
    said = [e.user_message for e in instance.all_logs(trained.run_id)]
    assert (
        f"{TABLE} {window[1]}: storage holds write unrecorded-1, committed by no Dagster run, "
        f"which ended without recording it (Dagster had write {recorded}"
    ) in " ".join(said)
