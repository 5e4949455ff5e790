"""What `zipline-dagster new-model` writes passes the project's own `make lint` as written:
ruff's checks (import order included) and its formatter, for either task and for feature
lists short and long."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zipline_dagster.scaffold import Scaffold


@pytest.mark.parametrize(
    ("task", "features", "keys"),
    [
        ("classification", None, "view_id"),
        ("regression", None, "view_id,listing_id"),
        ("classification", "price_log", "view_id"),
    ],
)
def test_a_scaffolded_defs_file_passes_lint_as_written(
    tmp_path: Path, task: str, features: str | None, keys: str
) -> None:
    scaffold = Scaffold.of(
        "churn_model", table="ctr.training_v1", task=task, window=4, features=features,
        label=None, keys=keys, threshold=None,
    )  # fmt: skip
    source = tmp_path / "churn_model.py"
    source.write_text(scaffold.render(" --window 4"))
    config = str(ROOT / "pyproject.toml")
    for args in (["check"], ["format", "--check", "--diff"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--config", config, str(source)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
