"""Model backfills at the speed of the cluster.

* 30 model days with the upstream table fresh: one backfill run, the partitions training
  together in one Ray job, per model day against one run of the trainer by hand.
* The whole demo graph (events -> features and labels on Spark -> training table ->
  model) for 30 days from nothing: the backfill's runs (a Spark producer's range in one
  run, the model's range in one Ray job) against running the same partitions one at a
  time (one run per partition), measured on the range's first 2 days and scaled to 30.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

import zipline_dagster.defs.listing_ctr as demo
from tests.bench.direct import direct_run
from tests.bench.record import Case, Series, record, repeat
from tests.conftest import TRAINERS
from tests.helpers import days_ending, run_days, write_table
from tests.support.training import TABLE, make_model, resources
from zipline_dagster.definitions import build_definitions
from zipline_dagster.features.spark import SparkResource
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.request import (
    build_training_request,
)
from zipline_dagster.jobs.resources import RayJobsResource
from zipline_dagster.lineage.backfill import model_partitions, plan_backfill
from zipline_dagster.lineage.internals import execute_plan_in_process
from zipline_dagster.lineage.partitions import daily_partitions
from zipline_dagster.rollout.assets import build_model_checks
from zipline_dagster.storage.days import shift_day
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.assets import build_model_asset

pytestmark = [pytest.mark.bench, pytest.mark.ray]
DAYS = 30
LAST = "2026-08-30"
START = "2026-07-11"
KEY = dg.AssetKey(["models", "listing_ctr_model"])


def test_model_days_with_upstream_fresh(ray_head: Any, tmp_path: Path) -> None:
    base = (tmp_path / "wh").as_uri()
    model_days = days_ending(LAST, DAYS)
    write_table(base, TABLE, days_ending(LAST, DAYS + 3), rows=2_000)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=base
    ).version
    model = make_model(version, base)
    defs = dg.Definitions(
        assets=[build_model_asset(model=model)],
        asset_checks=build_model_checks(model, daily_partitions),
        resources=resources(ray_head.dashboard_url, base),
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    tags = {ASSET_PARTITION_RANGE_START_TAG: model_days[0], ASSET_PARTITION_RANGE_END_TAG: LAST}

    def backfill(tags: dict[str, str] = tags) -> None:
        result = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
        assert result.success

    # warm-up (2 days): the cluster builds the trainer's pip env once per requirement set
    backfill(
        {
            ASSET_PARTITION_RANGE_START_TAG: model_days[0],
            ASSET_PARTITION_RANGE_END_TAG: model_days[1],
        }
    )
    measured = Series(f"{DAYS} model days in one run", repeat(backfill))
    per_day = Series("per model day", [v / DAYS for v in measured.values])
    assert instance.get_materialized_partitions(KEY) == set(model_days)

    argv = build_training_request(model, LAST, warehouse=base).argv
    argv = [
        a if not a.startswith("--model-dir=") else f"--model-dir={tmp_path / 'direct'}"
        for a in argv
    ]
    direct = Series("trainer by hand, one day", repeat(lambda: direct_run(argv)))
    ratio = per_day.median / direct.median
    record(
        Case(
            name=f"backfill of {DAYS} model days, upstream fresh (cost per model day)",
            baseline=direct,
            measured=per_day,
            goal="<= 0.5x one run by hand",
            value=ratio,
            value_text=f"{ratio:.2f}x",
            met=ratio <= 0.5,
            notes=[
                f"whole backfill run: {measured.spread()} for {DAYS} partitions "
                "(each its own materialization, manifest and 4 gate evaluations)",
                "one Ray job trains the range, one task per partition on warm workers; "
                "before: one job per partition, about 7.3 s per model day",
            ],
        )
    )


def test_scores_days_in_one_run(ray_head: Any, tmp_path: Path) -> None:
    """30 days of a scores table scored in one backfill run (one Ray job, one task a day)
    against one run per day, on the same trained model partitions."""
    from zipline_dagster import EventSource, ModelTransforms
    from zipline_dagster.definitions import ExternalTable
    from zipline_dagster.lineage.partitions import table_asset_key

    base = (tmp_path / "wh").as_uri()
    scored = days_ending(LAST, DAYS)
    write_table(base, TABLE, days_ending(LAST, DAYS + 4), rows=2_000)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=base
    ).version
    model = make_model(version, base)
    transforms = ModelTransforms(
        sources=[EventSource(table=TABLE)],
        models=[model],
        passthrough_fields=["listing_id"],
        output_namespace="ctr",
    )
    defs = build_definitions(
        external_tables=[ExternalTable(TABLE)],
        models=[model],
        transforms=[transforms],
        resources=resources(ray_head.dashboard_url, base),
        automation=False,
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    scores = table_asset_key(transforms.table)

    def run(key: dg.AssetKey, first: str, last: str) -> None:
        assert run_days(job, instance, key, first, last).success

    # the model partitions that score them (day ds: partition ds-1), in one range run
    run(KEY, shift_day(scored[0], -1), shift_day(LAST, -1))
    sample = 3

    def day_by_day() -> None:
        for ds in scored[:sample]:
            run(scores, ds, ds)

    one_by_one = Series(
        f"one run (one Ray job) per day, {sample} days x {DAYS // sample}",
        [v * DAYS / sample for v in repeat(day_by_day)],
    )
    together = Series(f"{DAYS} days in one run", repeat(lambda: run(scores, scored[0], LAST)))
    assert instance.get_materialized_partitions(scores) == set(scored)
    ratio = together.median / one_by_one.median
    record(
        Case(
            name=f"scores backfill of {DAYS} days (2k rows a day), trained models fresh",
            baseline=one_by_one,
            measured=together,
            goal="informational",
            value=ratio,
            value_text=f"{one_by_one.median / together.median:.1f}x faster",
            met=None,
            notes=[
                f"baseline: one run per day, measured on {sample} days and scaled "
                f"x{DAYS // sample}; measured: one run, one Ray job scoring every day as a "
                "task of its own, each day committed and materialized on its own",
            ],
        )
    )


def _demo_defs(base: str, ray_head: Any, spark: SparkResource) -> dg.Definitions:
    model = dataclasses.replace(demo.listing_ctr_model, model_artifact_base_uri=base)
    publish_trainer_archive(TRAINERS / "listing_ctr_model", model_name=model.name, base=base)
    return build_definitions(
        sources=[demo.listing_views],
        producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
        models=[model],
        resources={
            "launcher": RayJobsResource(address=ray_head.dashboard_url),
            "spark": spark,
            "warehouse": WarehouseResource(uri=base),
        },
        automation=False,
    )


@pytest.mark.spark
def test_whole_graph_backfill(ray_head: Any, spark_resource: SparkResource, tmp_path: Path) -> None:
    counter = iter(range(100))

    def backfill(days: int, *, one_at_a_time: bool) -> float:
        base = (tmp_path / f"wh{next(counter)}").as_uri()
        defs = _demo_defs(base, ray_head, spark_resource)
        instance = dg.DagsterInstance.ephemeral()
        parts = model_partitions(defs, KEY, START, shift_day(START, days - 1))
        t0 = time.perf_counter()
        plan = plan_backfill(defs, instance, KEY, parts)
        execute_plan_in_process(
            defs, instance, plan, log=lambda m: None, one_at_a_time=one_at_a_time
        )
        seconds = time.perf_counter() - t0
        assert instance.get_materialized_partitions(KEY) == set(parts)
        rerun = plan_backfill(defs, instance, KEY, parts)
        assert rerun.empty  # a fresh range plans nothing
        return seconds

    backfill(1, one_at_a_time=False)  # warm-up: the Spark session
    sample = 2
    one_by_one = Series(
        f"one partition per run, {sample} days x {DAYS // sample}",
        [v * DAYS / sample for v in repeat(lambda: backfill(sample, one_at_a_time=True))],
    )
    together = Series(
        f"{DAYS} days, the backfill's runs", repeat(lambda: backfill(DAYS, one_at_a_time=False))
    )
    ratio = together.median / one_by_one.median
    record(
        Case(
            name=f"whole demo graph, {DAYS}-day backfill from nothing",
            baseline=one_by_one,
            measured=together,
            goal="<= 0.5x one partition at a time",
            value=ratio,
            value_text=f"{ratio:.2f}x",
            met=ratio <= 0.5,
            notes=[
                f"baseline: the same plan with one run per partition, measured on the first "
                f"{sample} days and scaled x{DAYS // sample} (its per-day cost is flat: one "
                "Spark write per producer per day, one Ray job per model day)",
                "measured: each Spark producer writes its range in one job (partitioned "
                "write, committed per partition), the model's range trains in one Ray job",
            ],
        )
    )
