"""A newcomer's first model, walked on a copy of this project as the README tells it:
`zipline-dagster new-model` -> `dg check defs` -> a backfill of 3 days that trains them
and evaluates the champion -> an edit of the trainer without a new pin, which `dg check
defs` and `zipline-dagster check` name and training refuses. Real processes throughout
(the CLI, `dg`, Spark, the shared local Ray head, a Dagster instance on disk)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.helpers import in_process_dagster_home

BIN = ROOT / ".venv" / "bin"
NAME = "churn_model"


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

    made = run(str(BIN / "zipline-dagster"), "new-model", NAME, "--window", "3")
    assert made.returncode == 0, made.stderr
    checked = run(str(BIN / "dg"), "check", "defs")
    assert checked.returncode == 0, checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr

    trained = run(
        str(BIN / "zipline-dagster"),
        *("backfill", NAME, "--start-ds", "2026-07-12", "--end-ds", "2026-07-14", "--wait"),
        *("--workspace", str(project / "workspace.yaml")),
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr[-5000:]
    assert "status=COMPLETED_SUCCESS" in trained.stdout
    version = made.stdout.strip().removeprefix("version=")
    assert f"champion={version}/2026-07-14 (newest partition passing every gate)" in (
        trained.stdout
    ), trained.stdout

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
        *("--select", f"models/{NAME}", "--partition", "2026-07-14"),
    )
    assert again.returncode != 0
    assert f"refusing to train {NAME}: {drift}" in again.stdout + again.stderr
