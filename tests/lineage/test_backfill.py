"""`zipline-dagster backfill` end to end: a real Dagster backfill on a real instance,
runs launched by the instance's run launcher, Spark for features, Ray for the model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import BIN, ROOT, TRAINERS
from tests.helpers import in_process_dagster_home
from zipline_dagster.training.archive import publish_trainer_archive

MODEL = dg.AssetKey(["models", "listing_ctr_model"])


def demo_version() -> str:
    from zipline_dagster.defs.listing_ctr import LISTING_CTR_MODEL_VERSION

    return LISTING_CTR_MODEL_VERSION


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "zipline-dagster"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.ray
@pytest.mark.spark
def test_backfill_materializes_upstream_first_and_skips_fresh(
    ray_head: Any, tmp_path: Path
) -> None:
    home = in_process_dagster_home(tmp_path)
    warehouse = (tmp_path / "warehouse").as_uri()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ZIPLINE_HOME": str(tmp_path / "zipline"),
        "ZIPLINE_WAREHOUSE": warehouse,
        "RAY_ADDRESS": ray_head.dashboard_url,
        "SPARK_MASTER": "local[2]",
    }
    publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=warehouse
    )

    res = cli(
        env,
        "backfill",
        "listing_ctr_model",
        "--start-ds",
        "2026-07-11",
        "--end-ds",
        "2026-07-11",
        "--wait",
    )
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    backfill_id = next(
        line.split("=", 1)[1] for line in res.stdout.splitlines() if line.startswith("backfill_id=")
    )
    assert "status=COMPLETED_SUCCESS" in res.stdout
    # the champion is evaluated once the partitions are trained, and says where it points
    version = demo_version()
    assert f"champion={version}/2026-07-11 (newest partition passing every gate)" in res.stdout, (
        res.stdout
    )

    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance = dg.DagsterInstance.get()
        assert instance.get_backfill(backfill_id) is not None  # visible in the UI's backfill list
        ids = instance.event_log_storage.get_latest_storage_id_by_partition
        model_id = ids(MODEL, dg.DagsterEventType.ASSET_MATERIALIZATION)["2026-07-11"]
        upstream = {
            ("ctr", "training_v1"): ["2026-07-08", "2026-07-09", "2026-07-10", "2026-07-11"],
            ("ctr", "labels_v1"): ["2026-07-08", "2026-07-11"],
            ("ctr", "listing_features_v1"): ["2026-07-07", "2026-07-10"],
            ("ctr", "listing_views"): ["2026-07-01", "2026-07-11"],
        }
        for key, days in upstream.items():
            got = ids(dg.AssetKey(list(key)), dg.DagsterEventType.ASSET_MATERIALIZATION)
            for ds in days:
                assert got[ds] < model_id, f"{key} {ds} must be materialized before the model"
    finally:
        del os.environ["DAGSTER_HOME"]

    again = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11"
    )
    assert again.returncode == 0, again.stderr
    assert (
        "backfill_id=none" in again.stdout and "every requested partition is fresh" in again.stderr
    )

    # A wider range only plans what is new: one more day of each input, one more model.
    wider = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-12"
    )
    assert wider.returncode == 0, wider.stderr
    plan = wider.stderr
    assert "models/listing_ctr_model: 2026-07-12 (missing)" in plan
    assert "ctr/training_v1: 2026-07-12 (missing)" in plan
    assert "ctr/listing_features_v1: 2026-07-11 (missing)" in plan
    assert "ctr/listing_views: 2026-07-12 (missing)" in plan
    assert "2026-07-11 (missing)" not in plan.split("ctr/training_v1")[1].split("\n")[0]

    # Dagster's record alone does not make a partition fresh: the finished model must be
    # on storage. Lose its manifest and the planner (and so the CLI) plans it again.
    model_dir = Path(
        tmp_path, "warehouse", "models", "listing_ctr_model", demo_version(), "2026-07-11"
    )
    (model_dir / "_MANIFEST.json").unlink()
    lost = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11"
    )
    assert lost.returncode == 0, lost.stderr
    assert "models/listing_ctr_model: 2026-07-11 (stale: its finished model is missing" in (
        lost.stderr
    )
    assert "backfill_id=none" not in lost.stdout
    assert "ctr/training_v1" not in lost.stderr  # the inputs are still fresh


def test_backfill_refuses_unknown_model_and_bad_dates(tmp_path: Path) -> None:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "ZIPLINE_HOME": str(tmp_path / "z")}
    res = cli(
        env, "backfill", "no_such_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "no asset 'models/no_such_model'" in res.stderr
    assert "models/listing_ctr_model" in res.stderr
    res = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2020-01-01", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "--start-ds='2020-01-01' is not a partition" in res.stderr
    res = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2026-07-12", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "is after" in res.stderr
