"""Backfill scaling of the whole demo graph: 1, 10 and 30 model days from nothing (events,
features and labels on local Spark, the training table, one Ray Job per model day), then
a re-run of the same, now fresh, range. Per-day cost should stay flat; the fresh re-run
should cost a few percent of the first."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import zipline_dagster.defs.listing_ctr as demo
from tests.conftest import TRAINERS
from zipline_dagster.features.spark import SparkResource
from zipline_dagster.lineage.backfill import (
    execute_plan_in_process,
    model_partitions,
    plan_backfill,
)
from zipline_dagster.lineage.registry import build_definitions
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import shift_day
from zipline_dagster.training.archive import publish_trainer_archive
from zipline_dagster.training.resources import RayJobsResource

pytestmark = [pytest.mark.bench, pytest.mark.ray, pytest.mark.spark]
START = "2026-07-11"
KEY = dg.AssetKey(["models", "listing_ctr_model"])


def test_backfill_scaling(ray_head: Any, spark_resource: SparkResource, tmp_path: Path) -> None:
    rows = []
    for days in (1, 10, 30):
        base = (tmp_path / f"wh{days}").as_uri()
        model = dataclasses.replace(demo.listing_ctr_model, model_artifact_base_uri=base)
        publish_trainer_archive(TRAINERS / "listing_ctr_model", model_name=model.name, base=base)
        defs = build_definitions(
            sources=[demo.listing_views],
            producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
            models=[model],
            resources={
                "launcher": RayJobsResource(address=ray_head.dashboard_url, poll_max_s=0.5),
                "spark": spark_resource,
                "warehouse": WarehouseResource(uri=base),
            },
            automation=False,
        )
        instance = dg.DagsterInstance.ephemeral()
        parts = model_partitions(defs, KEY, START, shift_day(START, days - 1))
        t0 = time.perf_counter()
        execute_plan_in_process(
            defs, instance, plan_backfill(defs, instance, KEY, parts), log=lambda m: None
        )
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = plan_backfill(defs, instance, KEY, parts)
        execute_plan_in_process(defs, instance, plan, log=lambda m: None)
        rerun = time.perf_counter() - t0
        assert plan.empty
        rows.append((days, first, rerun))
    base_per_day = rows[0][1]
    lines = [
        f"  {d:>2} days: {first:6.1f}s, {first / d:5.1f}s/day ({first / d / base_per_day:.2f}x the 1-day cost), "
        f"fresh re-run {rerun:.2f}s ({rerun / first:.1%} of the first)"
        for d, first, rerun in rows
    ]
    print("\n[bench backfill/demo graph]\n" + "\n".join(lines))
