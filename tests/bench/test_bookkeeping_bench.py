"""What the cost and drift bookkeeping adds to a partition, in the same run as the work it
sits beside:

- a model partition: measuring its run's CPU and memory (the driver's ``_Usage``), the
  report's drift reference over a month of training rows (30 days of 20,000 rows, six
  features, and a day of holdout predictions), its cost metadata and its card; beside
  writing the model's report to storage, which the trainer does anyway;
- a scores day: measuring its run, its drift (six features and the scores of 20,000
  rows against the reference) and the extra bytes in the file's metadata, and the step's
  drift and cost metadata; beside staging the day's scores file without them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from zipline_runtime import trainer_io as tio
from zipline_runtime.driver import _Usage

from tests.bench.record import Case, Series, record
from zipline_dagster.defs.listing_ctr import listing_ctr_model
from zipline_dagster.jobs.cost import Cost, Usage
from zipline_dagster.scoring.drift import drift_metadata
from zipline_dagster.training.card import CardInput, model_card

pytestmark = [pytest.mark.bench]
REPEATS = 5
DAY_ROWS, WINDOW_DAYS = 20_000, 30
FEATURES = {f"f{i}": f"f{i}" for i in range(6)}
GOAL_S = 0.05


def _frame(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: rng.normal(size=rows) for c in FEATURES})


def _report(reference: dict[str, Any]) -> dict[str, Any]:
    return {
        "train": {"rows": DAY_ROWS * (WINDOW_DAYS - 1), "metrics": {"auc": 0.8, "logloss": 0.4}},
        "holdout": {"rows": DAY_ROWS, "metrics": {"auc": 0.75, "logloss": 0.45}},
        "drift_reference": reference,
    }


def test_the_cost_and_drift_bookkeeping_of_a_model_partition(tmp_path: Path) -> None:
    window = _frame(DAY_ROWS * WINDOW_DAYS, 0)
    predictions = np.random.default_rng(1).random(DAY_ROWS)
    base: list[float] = []
    added: list[float] = []
    for n in range(REPEATS):
        t0 = time.perf_counter()
        usage = _Usage()
        reference = tio.drift_reference(window, FEATURES, predictions)
        measured = usage.since()
        cost = Cost(10.0, 1, Usage(5.0, measured["cpu_s"], measured["peak_mem_mb"]))
        cost.metadata(rows=DAY_ROWS * WINDOW_DAYS)
        model_card(
            CardInput(
                model=listing_ctr_model,
                ds="2026-07-30",
                code_version="v",
                archive_uri="file:///a.zip",
                window=[f"2026-07-{d:02d}" for d in range(1, WINDOW_DAYS + 1)],
                input={"table": "ctr.training_v1", "snapshot_id": 1},
                flags=["--a=b"],
                report=_report(reference),
                cost=cost,
                champion=None,
            )
        )
        added.append(time.perf_counter() - t0)
        report = _report(reference)
        t0 = time.perf_counter()  # what the trainer writes anyway: its report
        tio.write_bytes(tmp_path.as_uri(), f"metrics-{n}.json", json.dumps(report).encode())
        base.append(time.perf_counter() - t0)
    _record("a model partition", "writing its report", base, added, "a 30-day window")


def test_the_cost_and_drift_bookkeeping_of_a_scores_day(tmp_path: Path) -> None:
    window = _frame(DAY_ROWS * WINDOW_DAYS, 0)
    reference = tio.drift_reference(window, FEATURES, np.random.default_rng(1).random(DAY_ROWS))
    day = _frame(DAY_ROWS, 2)
    scores = pd.DataFrame(
        {"view_id": np.arange(DAY_ROWS), "score": np.random.default_rng(3).random(DAY_ROWS)}
    )
    base: list[float] = []
    added: list[float] = []
    warehouse = tmp_path.as_uri()
    for n in range(REPEATS):
        t0 = time.perf_counter()
        tio.write_table_file(warehouse, "ctr.scores", "2026-07-31", f"plain-{n}", scores)
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        usage = _Usage()
        drift = tio.drift_of(reference, day, FEATURES, scores["score"])
        measured = usage.since()
        tio.write_table_file(
            warehouse, "ctr.scores", "2026-07-31", f"drift-{n}", scores, drift=drift
        )
        drift_metadata(drift)
        Cost(10.0, 3, Usage(4.0, measured["cpu_s"], measured["peak_mem_mb"])).metadata(DAY_ROWS)
        # less the write it replaces, measured just before
        added.append(time.perf_counter() - t0 - base[-1])
    _record("a scores day", "staging its scores file", base, added, f"{DAY_ROWS:,} rows")


def _record(what: str, beside: str, base: list[float], added: list[float], size: str) -> None:
    measured = Series("cost and drift bookkeeping", [max(a, 0.0) for a in added])
    baseline = Series(beside, base)
    record(
        Case(
            name=f"the cost and drift bookkeeping of {what} ({size})",
            baseline=baseline,
            measured=measured,
            goal=f"adds <= {GOAL_S} s a partition",
            value=measured.median,
            value_text=f"adds {measured.median * 1000:.1f} ms a partition "
            f"({measured.median / baseline.median:.1f}x {beside})",
            met=measured.median <= GOAL_S,
            notes=[
                "six float features; the reference histogram samples at most "
                f"{tio.DRIFT_SAMPLE:,} values a feature (an even stride); file:// storage"
            ],
        )
    )
