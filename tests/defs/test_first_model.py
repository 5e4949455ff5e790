"""A newcomer's first model, walked on a copy of this project as the README tells it:
`zipline-dagster new-model` -> `dg check defs` -> a backfill of a day that computes its
inputs first, trains it and evaluates the champion; backfilled again, nothing is fresh
to redo, a wider range plans only what is new, and a model lost on storage is planned
again -> an edit of the trainer without a new pin, which `dg check defs` and
`zipline-dagster check` name and training refuses -> `make demo`'s own path (its
summary included) for one day on that project. Real processes throughout (the CLI,
`dg`, Spark, the shared local Ray head, a Dagster instance on disk)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import ROOT
from tests.helpers import in_process_dagster_home

BIN = ROOT / ".venv" / "bin"
NAME = "churn_model"
DS = "2026-07-11"
#: the input partitions model day DS reads, directly or not (a 4-day window of the
#: training table, whose features reach a week back)
UPSTREAM = {
    ("ctr", "training_v1"): ["2026-07-08", "2026-07-09", "2026-07-10", "2026-07-11"],
    ("ctr", "labels_v1"): ["2026-07-08", "2026-07-11"],
    ("ctr", "listing_features_v1"): ["2026-07-07", "2026-07-10"],
    ("ctr", "listing_views"): ["2026-07-01", "2026-07-11"],
}


@pytest.mark.ray
@pytest.mark.spark
@pytest.mark.slow
def test_a_new_model_goes_from_scaffold_to_champion_and_cannot_drift(
    ray_head: Any, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    home = in_process_dagster_home(tmp_path)  # the runs execute in the backfill's process
    env = {
        **os.environ,
        "PYTHONPATH": str(project),  # the copy's code, not this checkout's
        "DAGSTER_HOME": str(home),
        "ZIPLINE_HOME": str(tmp_path / "zipline"),
        "RAY_ADDRESS": ray_head.dashboard_url,
        "SPARK_MASTER": "local[2]",
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=project, env=env, capture_output=True, text=True, timeout=900
        )

    made = run(str(BIN / "zipline-dagster"), "new-model", NAME)
    assert made.returncode == 0, made.stderr
    checked = run(str(BIN / "dg"), "check", "defs")
    assert checked.returncode == 0, checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    version = made.stdout.strip().removeprefix("version=")

    def backfill(start: str, end: str, *wait: str) -> subprocess.CompletedProcess[str]:
        done = run(str(BIN / "zipline-dagster"), "backfill", NAME, "--start-ds", start, "--end-ds", end, *wait)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr[-5000:]
        return done

    # the backfill trains the day with every input it needs, upstream first, and the
    # champion evaluates it (runs in the command's process, recorded in the instance)
    trained = backfill(DS, DS, "--wait", "--workspace", str(project / "workspace.yaml"))
    assert f"models/{NAME}: {DS} (missing)" in trained.stderr
    assert "status=COMPLETED_SUCCESS" in trained.stdout
    # stdout holds the command's answer only (the runs' output goes to a log file)
    answer = [line.partition("=")[0] for line in trained.stdout.splitlines()]
    assert answer == ["backfill_id", "status", "champion"], trained.stdout
    assert f"champion={version}/{DS} (newest partition passing every gate)" in trained.stdout
    backfill_id = trained.stdout.split("backfill_id=", 1)[1].split()[0]
    instance = dg.DagsterInstance.from_config(str(home))
    assert instance.get_backfill(backfill_id) is not None  # in the UI's backfill list
    ids = instance.event_log_storage.get_latest_storage_id_by_partition
    model_id = ids(dg.AssetKey(["models", NAME]), dg.DagsterEventType.ASSET_MATERIALIZATION)[DS]
    for key, days in UPSTREAM.items():
        got = ids(dg.AssetKey(list(key)), dg.DagsterEventType.ASSET_MATERIALIZATION)
        for ds in days:
            assert got[ds] < model_id, f"{key} {ds} must be materialized before the model"

    again = backfill(DS, DS)  # fresh: nothing to launch
    assert "backfill_id=none" in again.stdout
    assert "every requested partition is fresh" in again.stderr
    # a wider range plans only what is new: one more day of each input, one more model
    plan = backfill(DS, "2026-07-12").stderr
    assert f"models/{NAME}: 2026-07-12 (missing)" in plan
    assert "ctr/training_v1: 2026-07-12 (missing)" in plan
    assert "ctr/listing_features_v1: 2026-07-11 (missing)" in plan
    assert "ctr/listing_views: 2026-07-12 (missing)" in plan
    assert f"{DS} (missing)" not in plan.split("ctr/training_v1")[1].split("\n")[0]
    # Dagster's record alone does not make a partition fresh: the finished model must be
    # on storage. Lose its manifest and the planner plans it again (its inputs fresh).
    (manifest,) = (tmp_path / "zipline").rglob(f"models/{NAME}/{version}/{DS}/_MANIFEST.json")
    manifest.unlink()
    lost = backfill(DS, DS)
    assert f"models/{NAME}: {DS} (stale: its finished model is missing" in lost.stderr
    assert "backfill_id=none" not in lost.stdout
    assert "ctr/training_v1" not in lost.stderr

    train = project / "trainers" / NAME / "trainer" / "train.py"
    train.write_text(train.read_text() + "\n# a new flag, not built yet\n")
    drift = f"model '{NAME}' pins trainer version {version}, but its source"
    warned = run(str(BIN / "dg"), "check", "defs")
    assert drift in warned.stdout + warned.stderr
    refused = run(str(BIN / "zipline-dagster"), "check")
    assert refused.returncode == 1 and drift in refused.stderr
    again = run(
        str(BIN / "dagster"),
        *("asset", "materialize", "-m", "zipline_dagster.defs"),
        *("--select", f"models/{NAME}", "--partition", DS),
    )
    assert again.returncode != 0
    assert f"refusing to train {NAME}: {drift}" in again.stdout + again.stderr

    # `make demo`'s path on the same project, for one day: the demo's model trains on the
    # inputs computed above, the champion moves, the next day is scored and monitored,
    # and the summary reads it all back (no other test runs the demo's own code)
    demo_env = {**env, "ZIPLINE_DEMO_START": DS, "ZIPLINE_DEMO_END": DS}
    demo = [str(BIN / "python"), str(project / "scripts" / "demo.py")]
    # a step that fails ends the demo with one error line naming it and its run, not
    # with the demo's own traceback (here: no Ray cluster where RAY_ADDRESS points)
    no_ray = {**demo_env, "RAY_ADDRESS": "http://127.0.0.1:1"}
    failed = subprocess.run(demo, cwd=project, env=no_ray, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: models/listing_ctr_model {DS} failed: Failure: no Ray cluster answers at http://127.0.0.1:1"), last  # fmt: skip
    assert " (run " in last and "Traceback (most recent call last)" not in failed.stderr
    # a setting the code location refuses at load is one line too
    bad = {**demo_env, "SPARK_MASTER": "spark:/m:7077"}
    refused = subprocess.run(demo, cwd=project, env=bad, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: SPARK_MASTER='spark:/m:7077' is not a Spark master URL"), refused.stderr  # fmt: skip
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    shown = subprocess.run(demo, cwd=project, env=demo_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert shown.returncode == 0, shown.stdout[-5000:] + shown.stderr[-5000:]
    summary = shown.stdout.split("[5/5]", 1)[1]
    assert f"{DS}  holdout AUC 0." in summary and "checks passed" in summary, summary
    assert "champion: " in summary and f"/{DS} (holdout AUC 0." in summary, summary
    assert "2026-07-12  realized AUC 0." in summary, summary
    assert f"scored by listing_ctr_model {DS}" in summary, summary
    # Spark's start-up banner and Hadoop's native-library note stay out of the output
    for noise in ("default log4j profile", "setLogLevel", "NativeCodeLoader"):
        assert noise not in shown.stdout + shown.stderr, noise
    # a second run finds everything fresh, runs nothing and says the same
    rerun = subprocess.run(demo, cwd=project, env=demo_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    assert "every requested partition is fresh" in rerun.stdout, rerun.stdout
    assert rerun.stdout.split("[5/5]", 1)[1].split(":", 1)[1] == summary.split(":", 1)[1]
