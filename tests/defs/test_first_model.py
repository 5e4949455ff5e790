"""A newcomer's first model, walked on a copy of this project as the README tells it:
`zipline-dagster new-model` -> `dg check defs` -> a backfill of a day that computes its
inputs first, trains it and evaluates the champion; backfilled again, nothing is fresh
to redo, a wider range plans only what is new, and a model lost on storage is planned
again -> an edit of the trainer without a new pin, which `dg check defs` and
`zipline-dagster check` name and training refuses -> `make demo`'s own path (its
summary included) for one day on that project. Real processes throughout (the CLI,
`dg`, Spark, the shared local Ray head, a Dagster instance on disk)."""

from __future__ import annotations

import json
import os
import re
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
def dagster_staleness(run: Any, name: str, ds: str) -> str:
    """Dagster's own staleness of model partition ``ds`` ("unsynced" in the UI is STALE),
    computed in the project's environment from its instance. Dagster has no public form
    of it outside the UI's GraphQL: its resolver is private, and used here only."""
    code = (
        "import dagster as dg\n"
        "from dagster._core.definitions.data_version import CachingStaleStatusResolver\n"
        "from dagster._core.loader import LoadingContextForTest\n"
        "from zipline_dagster.defs import defs\n"
        "i = dg.DagsterInstance.get()\n"
        "r = CachingStaleStatusResolver(i, defs.resolve_asset_graph(), LoadingContextForTest(i))\n"
        f"print(r.get_status(dg.AssetKey(['models', {name!r}]), {ds!r}).value)\n"
    )
    done = run(str(BIN / "python"), "-c", code)
    assert done.returncode == 0, done.stderr
    return str(done.stdout.strip().splitlines()[-1])


def latest_metadata(instance: dg.DagsterInstance, key: list[str], ds: str) -> dict[str, Any]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[ds]), limit=1
    ).records
    assert records, f"{key} {ds} is not materialized"
    mat = records[0].asset_materialization
    assert mat is not None
    return {k: v.value for k, v in mat.metadata.items()}


def test_a_new_model_goes_from_scaffold_to_champion_and_cannot_drift(
    ray_head: Any, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    # its modules' bytecode, as `make demo` and `make test` compile theirs (the 20-odd
    # processes below would each compile the code location from source)
    subprocess.run([str(BIN / "python"), "-m", "compileall", "-q", "-j", "0", str(project / "zipline_dagster")], check=True)  # fmt: skip
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
    # every change of what a partition trains on shows: removing a feature makes the
    # partition unsynced in Dagster's own staleness and the next backfill retrains it; a
    # description changes no output and stales nothing
    defs_file = project / "zipline_dagster" / "defs" / f"{NAME}.py"
    declared = defs_file.read_text()
    defs_file.write_text(declared.replace('task="classification",', 'task="classification",\n    description="churn",'))  # fmt: skip
    assert "every requested partition is fresh" in backfill(DS, DS, "--wait", "--workspace", str(project / "workspace.yaml")).stderr  # fmt: skip
    assert dagster_staleness(run, NAME, DS) == "FRESH"
    without = defs_file.read_text().replace('    "clicked_sum_1d",\n', "")
    assert "clicked_sum_1d" not in without
    defs_file.write_text(without)
    assert dagster_staleness(run, NAME, DS) == "STALE"
    retrained = backfill(DS, DS, "--wait", "--workspace", str(project / "workspace.yaml"))
    assert f"models/{NAME}: {DS} (stale: code version changed to {version}-" in retrained.stderr
    assert "ctr/training_v1" not in retrained.stderr  # its inputs are fresh
    (manifest,) = (tmp_path / "zipline").rglob(f"models/{NAME}/{version}/{DS}/_MANIFEST.json")
    assert dagster_staleness(run, NAME, DS) == "FRESH"
    trained_under = json.loads(manifest.read_text())["declaration"]
    assert "clicked_sum_1d" not in trained_under["job_configs"]["features"], trained_under
    # a gate the champion fails: it keeps serving, and its check names the gate
    defs_file.write_text(defs_file.read_text().replace("threshold=0.6", "threshold=0.99"))
    judged = backfill(DS, DS, "--wait", "--workspace", str(project / "workspace.yaml"))
    assert f"champions/{NAME}: its gates changed" in judged.stderr, judged.stderr
    assert f"champion={version}/{DS} (stays at {version}/{DS}, which fails the current gates (holdout_auc=0." in judged.stdout, judged.stdout  # fmt: skip
    instance = dg.DagsterInstance.from_config(str(home))
    check = dg.AssetCheckKey(dg.AssetKey(["champions", NAME]), "champion_passes_gates")
    evaluation = instance.event_log_storage.get_latest_asset_check_execution_by_key([check])[check]
    assert evaluation.status.value == "FAILED"
    assert "fails holdout_auc >= 0.99" in str(evaluation.event.dagster_event.event_specific_data.description)  # type: ignore[union-attr]  # fmt: skip

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
    # every partition is fresh, and still the backfill refuses: the trainer drifted
    fresh = run(str(BIN / "zipline-dagster"), "backfill", NAME, "--start-ds", DS, "--end-ds", DS)
    assert fresh.returncode != 0 and drift in fresh.stderr, fresh.stdout + fresh.stderr

    # a regression model: scaffold -> backfill of its monitoring -> champion, scores and
    # realized RMSE / MAE / R² (the day after DS, scored by partition DS)
    made = run(str(BIN / "zipline-dagster"), "new-model", "price_model", "--task", "regression", "--label", "price_log")  # fmt: skip
    assert made.returncode == 0, made.stderr
    day = "2026-07-12"
    priced = run(str(BIN / "zipline-dagster"), "backfill", "monitoring/ctr/price_model_scores", "--start-ds", day, "--end-ds", day, "--wait", "--workspace", str(project / "workspace.yaml"))  # fmt: skip
    assert priced.returncode == 0, priced.stdout + priced.stderr[-5000:]
    assert "status=COMPLETED_SUCCESS" in priced.stdout
    assert f"champion={made.stdout.strip().removeprefix('version=')}/{DS} (newest partition passing every gate)" in priced.stdout  # fmt: skip
    instance = dg.DagsterInstance.from_config(str(home))
    monitored = latest_metadata(instance, ["monitoring", "ctr", "price_model_scores"], day)
    assert monitored["task"] == "regression" and monitored["model_ds"] == DS, monitored
    for metric in ("rmse", "mae", "r2"):
        assert isinstance(monitored[f"realized/{metric}"], float), monitored
        assert isinstance(monitored[f"training/holdout_{metric}"], float), monitored
    assert 0.5 < monitored["realized/r2"] <= 1.0, monitored

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
    # each trained partition's cost, each scored day's drift and cost
    assert re.search(r"cost [\d.]+s wall, [\d.]+ CPU-s, \d+ MB peak", summary), summary
    assert re.search(r"drift predictions PSI \d\.\d{3}; top features \w+ \d", summary), summary
    # Spark's start-up banner and Hadoop's native-library note stay out of the output
    for noise in ("default log4j profile", "setLogLevel", "NativeCodeLoader"):
        assert noise not in shown.stdout + shown.stderr, noise
    # a second run finds everything fresh, runs nothing and says the same
    rerun = subprocess.run(demo, cwd=project, env=demo_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    assert "every requested partition is fresh" in rerun.stdout, rerun.stdout
    assert rerun.stdout.split("[5/5]", 1)[1].split(":", 1)[1] == summary.split(":", 1)[1]
    # an impossible gate: the demo says in one line that no partition passed it, with the
    # best value, and scores nothing (no step traceback)
    ctr = project / "zipline_dagster" / "defs" / "listing_ctr.py"
    ctr.write_text(ctr.read_text().replace('name="holdout_auc", threshold=0.65', 'name="holdout_auc", threshold=0.99'))  # fmt: skip
    gated = subprocess.run(demo, cwd=project, env=demo_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert gated.returncode == 1, gated.stdout[-3000:] + gated.stderr[-3000:]
    assert "Traceback" not in gated.stdout + gated.stderr, gated.stderr[-3000:]
    assert (
        gated.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: listing_ctr_model: no partition of {DS}..{DS} passed its gates: holdout_auc "
            f">= 0.99 (best holdout_auc 0."
        )
    ), gated.stderr[-3000:]
