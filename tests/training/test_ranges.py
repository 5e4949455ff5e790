"""A backfill run of many model partitions: on Ray they train together in one job (one
task each); each partition is still its own materialization, manifest and checks, and a
failing partition fails only itself."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, write_partition, write_table
from tests.training.test_assets import TABLE, make_model, resources
from zipline_dagster.lineage.partitions import daily_partitions
from zipline_dagster.rollout.assets import build_model_checks
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.paths import MANIFEST_NAME
from zipline_dagster.training.archive import publish_trainer_archive
from zipline_dagster.training.assets import build_model_asset

pytestmark = pytest.mark.ray
KEY = dg.AssetKey(["models", "listing_ctr_model"])
DAYS = ["2026-08-05", "2026-08-06", "2026-08-07", "2026-08-08", "2026-08-09"]


def run_range(defs: dg.Definitions, instance: dg.DagsterInstance, start: str, end: str) -> Any:
    return defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance,
        tags={ASSET_PARTITION_RANGE_START_TAG: start, ASSET_PARTITION_RANGE_END_TAG: end},
        raise_on_error=False,
    )


def materializations(instance: dg.DagsterInstance, result: Any) -> dict[str, Any]:
    """The model partitions this run materialized, as Dagster recorded them."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=KEY), limit=1000
    ).records
    return {
        r.partition_key: r.asset_materialization
        for r in records
        if r.run_id == result.run_id and r.asset_materialization is not None
    }


def test_range_trains_in_one_ray_job_and_a_failing_partition_fails_only_itself(
    ray_head: Any, file_base: str
) -> None:
    write_table(file_base, TABLE, days_ending(DAYS[-1], 8)[:-1], rows=300)
    # The last day's price_log is text: only the window that reads it (ds 08-09) fails.
    bad = ctr_rows(DAYS[-1], 300)
    bad["price_log"] = bad["price_log"].map(lambda v: f"x{v:.2f}")
    write_partition(file_base, TABLE, DAYS[-1], bad)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    defs = dg.Definitions(
        assets=[build_model_asset(model=model)],
        asset_checks=build_model_checks(model, daily_partitions),
        resources=resources(ray_head.dashboard_url, file_base),
    )
    instance = dg.DagsterInstance.ephemeral()

    result = run_range(defs, instance, DAYS[0], DAYS[-1])
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None
    text = failure.message
    assert "1 of 5 partitions of listing_ctr_model failed (4 trained and materialized)" in text
    assert f"- {DAYS[-1]}: its trainer exited with" in text
    assert "could not convert string to float" in text  # the trainer's own error

    mats = materializations(instance, result)
    assert sorted(mats) == DAYS[:-1]
    store = blob_store(file_base)
    job_ids = set()
    for ds, mat in mats.items():
        md = {k: v.value for k, v in mat.metadata.items()}
        # each partition its own metadata, artifacts and manifest
        assert md["artifact_uri"] == f"{file_base}/models/listing_ctr_model/{version}/{ds}"
        assert md["window"] == f"{days_ending(ds, 4)[0]}..{ds}"
        assert md["range"] == f"{DAYS[0]}..{DAYS[-1]}"
        assert md["holdout/auc"] > 0.5
        assert store.exists(f"{md['artifact_uri']}/{MANIFEST_NAME}")
        job_ids.add(md["ray_job_id"])
    # one Ray job trained the range
    assert job_ids == {f"zd-listing_ctr_model-{version}-{DAYS[0]}_{DAYS[-1]}-1"}
    assert not store.exists(
        f"{file_base}/models/listing_ctr_model/{version}/{DAYS[-1]}/{MANIFEST_NAME}"
    )
    assert instance.get_materialized_partitions(KEY) == set(DAYS[:-1])

    # Mend the day and run the last two partitions: both succeed, and the blocking gates
    # are recorded against each partition of the range.
    write_partition(file_base, TABLE, DAYS[-1], ctr_rows(DAYS[-1], 300))
    result = run_range(defs, instance, DAYS[-2], DAYS[-1])
    assert result.success
    assert sorted(materializations(instance, result)) == DAYS[-2:]
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert sorted((e.partition, e.check_name) for e in evaluations) == sorted(
        (ds, gate)
        for ds in DAYS[-2:]
        for gate in (
            "manifest_verifies",
            "no_regression_vs_champion",
            "report_complete",
            "rollout_thresholds",
        )
    )
    assert all(e.passed and e.target_materialization_data is not None for e in evaluations)
    assert instance.get_materialized_partitions(KEY) == set(DAYS)
