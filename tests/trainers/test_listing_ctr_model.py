"""The reference trainer runs by hand, with the same flags, without Ray or Dagster."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import ctr_rows, days_ending, write_partition, write_table
from tests.support.trainers import run_trainer

DS = "2026-07-10"


def test_trainer_by_hand_writes_model_and_full_report(file_base: str, tmp_path: Path) -> None:
    write_table(file_base, "ctr.training_v1", days_ending(DS, 4), rows=500)
    out = tmp_path / "out"
    res = run_trainer(
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-07",
        f"--end-ds={DS}",
        f"--model-dir={out.as_uri()}",
        f"--warehouse={file_base}",
        "--label-column=label",
        "--eval-days=2",
        "--features=price_log,inventory_count",
        python=("-X", "importtime"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # its metrics are numpy's (the trainer support's): the process imports no scikit-learn,
    # which xgboost would otherwise pull in (over a CPU-second in every job)
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in res.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert {"xgboost", "matplotlib.figure"} <= imported
    # ("sklearn" alone is xgboost's attempt, refused; its modules are the import)
    assert not {m for m in imported if m.startswith("sklearn.") or m == "matplotlib.pyplot"}
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "model.json", "pr_curve.png"]
    r = json.loads((out / "metrics.json").read_text())
    assert r["split"] == {
        "method": "date",
        "eval_days": 2,
        "train_days": ["2026-07-07", "2026-07-08"],
        "holdout_days": ["2026-07-09", "2026-07-10"],
    }
    assert r["train"]["rows"] == 1000 and r["holdout"]["rows"] == 1000
    assert r["train"]["date_range"] == {"start": "2026-07-07", "end": "2026-07-08"}
    assert r["holdout"]["date_range"] == {"start": "2026-07-09", "end": "2026-07-10"}
    for split in ("train", "holdout"):
        assert set(r[split]["metrics"]) == {"auc", "logloss", "accuracy", "positive_rate"}
    assert r["holdout"]["metrics"]["auc"] > 0.6
    assert r["status"] == {}
    assert r["feature_importance"][0]["feature"] == "price_log"  # the strongest signal
    assert abs(sum(f["share"] for f in r["feature_importance"]) - 1.0) < 1e-6
    assert len(r["pr_curve"]["precision"]) == len(r["pr_curve"]["recall"]) > 10
    assert (out / "pr_curve.png").read_bytes().startswith(b"\x89PNG")


def test_one_class_training_set_is_reported_as_such(file_base: str, tmp_path: Path) -> None:
    days = days_ending(DS, 3)
    for ds in days[:-1]:
        write_partition(file_base, "ctr.t", ds, ctr_rows(ds, 100, label=1))
    write_partition(file_base, "ctr.t", days[-1], ctr_rows(days[-1], 100))
    res = run_trainer(
        "--input-table=ctr.t",
        f"--start-ds={days[0]}",
        f"--end-ds={DS}",
        f"--model-dir={tmp_path.as_uri()}/o",
        f"--warehouse={file_base}",
        "--eval-days=1",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert r["train"]["metrics"]["auc"] is None
    assert r["status"]["train.auc"].startswith("training set has one class")
    assert r["holdout"]["metrics"]["auc"] is not None  # the holdout itself is fine


def test_eval_days_zero_reports_empty_holdout(file_base: str, tmp_path: Path) -> None:
    write_table(file_base, "ctr.t", days_ending(DS, 2), rows=100)
    res = run_trainer(
        "--input-table=ctr.t",
        "--start-ds=2026-07-09",
        f"--end-ds={DS}",
        f"--model-dir={tmp_path.as_uri()}/o",
        f"--warehouse={file_base}",
        "--eval-days=0",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert r["holdout"]["rows"] == 0
    assert r["status"]["holdout.auc"].startswith("empty split")
    assert r["pr_curve"] is None


def test_missing_partition_fails_naming_it(file_base: str, tmp_path: Path) -> None:
    write_table(file_base, "ctr.t", ["2026-07-09"], rows=10)
    res = run_trainer(
        "--input-table=ctr.t",
        "--start-ds=2026-07-08",
        f"--end-ds={DS}",
        f"--model-dir={tmp_path.as_uri()}/o",
        f"--warehouse={file_base}",
    )
    assert res.returncode == 2
    assert "missing partitions 2026-07-08, 2026-07-10" in res.stdout
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_all_holdout_window_fails_as_empty_training_split(file_base: str, tmp_path: Path) -> None:
    write_table(file_base, "ctr.t", [DS], rows=10)
    res = run_trainer(
        "--input-table=ctr.t",
        f"--start-ds={DS}",
        f"--end-ds={DS}",
        f"--model-dir={tmp_path.as_uri()}/o",
        f"--warehouse={file_base}",
        "--eval-days=1",
    )
    assert res.returncode == 2 and "empty split: the training set is empty" in res.stdout


def test_bad_flag_is_refused_by_name(file_base: str, tmp_path: Path) -> None:
    res = run_trainer(
        "--input-table=ctr.t",
        "--start-ds=2026-07-11",
        f"--end-ds={DS}",
        f"--model-dir={tmp_path.as_uri()}",
        f"--warehouse={file_base}",
    )
    assert (
        res.returncode == 2 and "--start-ds=2026-07-11 is after --end-ds=2026-07-10" in res.stderr
    )
