"""Orchestration overhead: one model partition through Dagster + a Ray Job on a warm
cluster, versus the same trainer run directly on the same data, in the same run.

Prints seconds and the ratio for each table size; asserts nothing about time.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_table
from tests.training.test_assets import DS, TABLE, make_model, materialize, resources
from zipline_dagster.training.archive import publish_trainer_archive
from zipline_dagster.training.request import build_training_request

pytestmark = [pytest.mark.bench, pytest.mark.ray]
REPEATS = 3


def _direct(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=TRAINERS / "listing_ctr_model",
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


@pytest.mark.parametrize(
    ("rows", "rounds", "repeats"),
    [(2_000, 20, REPEATS), (100_000, 300, 2), (1_000_000, 450, 1)],
    ids=["small", "large", "long"],  # long: training itself takes over 60 s
)
def test_overhead_vs_direct(
    ray_head: Any, tmp_path: Path, rows: int, rounds: int, repeats: int
) -> None:
    base = (tmp_path / "wh").as_uri()
    write_table(base, TABLE, days_ending(DS, 4), rows=rows)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=base
    ).version
    job_configs = {
        "label-column": "label",
        "eval-days": "1",
        "features": "price_log,inventory_count",
        "num-rounds": str(rounds),
    }
    model = make_model(version, base, job_configs=job_configs)
    res = resources(ray_head.dashboard_url, base)
    if repeats > 1:
        # warm-up: the cluster caches the archive and the pip env (the long case runs
        # after the others on the same cluster, already warm)
        materialize(model, res)

    platform = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert materialize(model, res).success
        platform.append(time.perf_counter() - t0)

    argv = build_training_request(model, DS, warehouse=base).argv
    argv = [
        a if not a.startswith("--model-dir=") else f"--model-dir={tmp_path / 'direct'}"
        for a in argv
    ]
    direct = [_direct(argv) for _ in range(repeats)]

    p, d = statistics.median(platform), statistics.median(direct)
    print(
        f"\n[bench overhead/{rows} rows/day x4, {rounds} rounds] direct {d:.2f}s, "
        f"dagster+ray job {p:.2f}s, overhead {p - d:.2f}s, ratio {p / d:.2f}x (medians of {repeats})"
    )
