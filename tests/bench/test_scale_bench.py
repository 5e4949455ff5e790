"""Data at scale (issue 68): the window of a synthetic Iceberg table (4 days, 8 float
features and a label) trained three ways at 1M, 4M, 16M and 40M rows: (a) xgboost by
hand (the limit), (b) the model partition in-process, (c) the model partition on 2 Ray
Train workers; and a 20M-row day scored by the runtime's scorer against
``booster.predict`` by hand over the same files. Medians of 3 (the largest size once).
Writes ``results/scaling.json``; the report renders its table and verdicts."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from zipline_runtime.contract import MANIFEST_NAME

from tests.bench import scale
from tests.conftest import TRAINERS
from tests.helpers import tables_of

pytestmark = pytest.mark.bench

SIZES = [1_000_000, 4_000_000, 16_000_000, 40_000_000]
SCORE_ROWS = 20_000_000
CTR = TRAINERS / "listing_ctr_model"


def repeats(rows: int) -> int:
    return 1 if rows == SIZES[-1] else 3


def median_run(runs: list[scale.Run]) -> dict[str, Any]:
    """Each figure's median over the runs (and the runs themselves)."""

    def med(key: str) -> float | None:
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "wall_s": med("wall_s"),
        "largest_mb": med("largest_mb"),
        "total_mb": med("total_mb"),
        "worker_mb": med("worker_mb"),
        "runs": [asdict(r) for r in runs],
    }


def train_size(rows: int, root: Path, env: dict[str, str], head_pid: int) -> dict[str, Any]:
    warehouse = (root / f"w{rows}").as_uri()
    table = "bench.scale"
    scale.write_window(warehouse, table, rows)
    hold = scale.DAYS[-1]
    runs: dict[str, list[scale.Run]] = {"hand": [], "inprocess": [], "ray": []}
    for n in range(repeats(rows)):  # interleaved: the three share the machine's noise
        runs["hand"].append(
            scale.measure(
                [sys.executable, "-c", scale.BY_HAND, warehouse, table, hold], cwd=CTR, env=env
            )
        )
        runs["inprocess"].append(
            scale.measure(
                scale.trainer_argv(warehouse, table, f"{warehouse}/m/in{n}"), cwd=CTR, env=env
            )
        )
        runs["ray"].append(
            scale.measure(
                scale.trainer_argv(warehouse, table, f"{warehouse}/m/ray{n}", "--num-workers=2"),
                cwd=CTR,
                env=env,
                also=(head_pid,),
            )
        )
    report = json.loads((root / f"w{rows}" / "m" / "in0" / "metrics.json").read_text())
    return {
        "rows": rows,
        "frame_mb": round(rows * scale.FRAME_ROW_BYTES / 2**20, 1),
        "matrix": report["matrix"]["kind"],
        **{k: median_run(v) for k, v in runs.items()},
    }


def score_day(root: Path, env: dict[str, str]) -> dict[str, Any]:
    """A 20M-row day scored by the runtime's scorer (batches, files of 4, drift counted)
    and by hand (each file read, predicted and its scores written)."""
    warehouse = (root / "score").as_uri()
    scale.write_window(warehouse, "bench.day", SCORE_ROWS, days=["2026-07-11"])
    model = root / "score" / "model"
    train_w = (root / "score_train").as_uri()
    scale.write_window(train_w, "bench.scale", 400_000)
    scale.measure(scale.trainer_argv(train_w, "bench.scale", model.as_uri()), cwd=CTR, env=env)
    (model / MANIFEST_NAME).write_text(
        json.dumps({"model": "bench", "version": "v1", "ds": scale.DAYS[-1]})
    )
    files = [
        str(Path(f[len("file://") :]))
        for f in tables_of(warehouse).days("bench.day")["2026-07-11"].files
    ]
    hand_out = root / "score" / "hand"
    runtime, hand = [], []
    for n in range(3):
        runtime.append(
            scale.measure(
                [sys.executable, "-m", "zipline_runtime.score", "--input-table=bench.day",
                 "--ds=2026-07-11", f"--model-dir={model.as_uri()}", "--output-table=bench.s",
                 f"--warehouse={warehouse}", f"--write-id=w{n}"],
                cwd=CTR, env=env,
            )
        )  # fmt: skip
        hand_out.mkdir(parents=True, exist_ok=True)
        hand.append(
            scale.measure(
                [sys.executable, "-c", scale.PREDICT_BY_HAND, str(model / "model.json"),
                 str(hand_out), *files],
                cwd=CTR, env=env,
            )
        )  # fmt: skip
        shutil.rmtree(hand_out)
    return {"rows": SCORE_ROWS, "files": len(files), "runtime": median_run(runtime),
            "hand": median_run(hand)}  # fmt: skip


#: the results of this session's cases, saved after each one
RESULTS: dict[str, Any] = {"rounds": scale.ROUNDS, "sizes": [], "scoring": None}


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("rows", SIZES)
def test_training_scales_with_the_window(ray_head: Any, tmp_path: Path, rows: int) -> None:
    env = {**os.environ, "RAY_ADDRESS": ray_head.gcs_address}
    RESULTS["sizes"].append(train_size(rows, tmp_path, env, ray_head.pid))
    shutil.rmtree(tmp_path / f"w{rows}")
    scale.save(RESULTS)
    print(f"\n[bench] scale {rows}: {json.dumps(RESULTS['sizes'][-1])[:600]}", flush=True)


@pytest.mark.timeout(2400)
def test_a_large_day_scores_in_batches(tmp_path: Path) -> None:
    env = dict(os.environ)
    RESULTS["scoring"] = score_day(tmp_path, env)
    scale.save(RESULTS)
    print(f"\n[bench] scoring: {json.dumps(RESULTS['scoring'])[:600]}", flush=True)
