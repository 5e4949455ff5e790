"""The reference regression trainer runs by hand, with the platform's flags, without Ray or
Dagster: a date split, RMSE / MAE / R² of each split, a status for each undefined one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_partition

DS = "2026-07-10"


def rows(ds: str, n: int, *, constant: float | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(int(ds.replace("-", "")))
    x = rng.normal(0.0, 1.0, n)
    y = 3.0 + 2.0 * x + rng.normal(0.0, 0.3, n) if constant is None else np.full(n, constant)
    return pd.DataFrame({"id": np.arange(n), "x": x, "noise": rng.normal(size=n), "price_log": y})


def run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.train", *flags],
        cwd=TRAINERS / "listing_price_model",
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_regressor_by_hand_reports_rmse_mae_r2_per_split(file_base: str, tmp_path: Path) -> None:
    days = days_ending(DS, 4)
    for ds in days[:-1]:
        write_partition(file_base, "ctr.t", ds, rows(ds, 300))
    write_partition(file_base, "ctr.t", DS, rows(DS, 300, constant=4.0))  # R² undefined
    res = run(
        "--input-table=ctr.t",
        f"--start-ds={days[0]}",
        f"--end-ds={DS}",
        f"--model-dir={(tmp_path / 'o').as_uri()}",
        f"--warehouse={file_base}",
        "--label-column=price_log",
        "--features=x,noise",
        "--eval-days=1",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert r["task"] == "regression" and r["model_type"] == "xgboost.reg:squarederror"
    assert r["split"]["holdout_days"] == [DS] and r["train"]["rows"] == 900
    assert set(r["train"]["metrics"]) == {"rmse", "mae", "r2", "mean_label"}
    assert r["train"]["metrics"]["r2"] > 0.9 and r["train"]["metrics"]["rmse"] < 0.5
    assert r["holdout"]["metrics"]["r2"] is None
    assert r["status"] == {"holdout.r2": "every holdout label is 4: R² is undefined"}
    assert r["feature_importance"][0]["feature"] == "x"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["metrics.json", "model.json"]


def test_a_label_that_is_not_a_number_is_refused_naming_it(file_base: str, tmp_path: Path) -> None:
    frame = rows(DS, 50).assign(price_log="high")
    write_partition(file_base, "ctr.t", DS, frame)
    res = run(
        "--input-table=ctr.t",
        f"--start-ds={DS}",
        f"--end-ds={DS}",
        f"--model-dir={(tmp_path / 'o').as_uri()}",
        f"--warehouse={file_base}",
        "--label-column=price_log",
        "--eval-days=0",
    )
    assert res.returncode != 0
    said = res.stdout + res.stderr  # the trainer logs its error (tio.run_main)
    assert "label column 'price_log' of ctr.t is object, not numeric" in said, said
