"""Distributed training (2 workers on a 2-node cluster): a run with one worker killed at
round 5 of 10 vs a clean run on the same data, in the same run."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_table
from tests.training.test_assets import DS, TABLE
from tests.training.test_distributed import ROUNDS, run
from zipline_dagster.training.archive import publish_trainer_archive

pytestmark = [pytest.mark.bench, pytest.mark.ray]


def test_recovery_overhead(ray_two_nodes: Any, file_base: str) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=2000)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    run(
        ray_two_nodes, file_base, version, f"{file_base}/runs/warmup", {}
    )  # pip env + archive caches
    t0 = time.perf_counter()
    clean = run(ray_two_nodes, file_base, version, f"{file_base}/runs/clean", {})
    t_clean = time.perf_counter() - t0
    t0 = time.perf_counter()
    faulty = run(
        ray_two_nodes, file_base, version, f"{file_base}/runs/faulty", {"fail-at-round": "5"}
    )
    t_fault = time.perf_counter() - t0
    print(
        f"\n[bench recovery/2 workers x {ROUNDS} rounds] clean {t_clean:.1f}s "
        f"(Ray Train {clean['report']['distributed']['seconds']:.1f}s), one worker killed at round 5 "
        f"{t_fault:.1f}s (Ray Train {faulty['report']['distributed']['seconds']:.1f}s, resumed from round "
        f"{faulty['report']['distributed']['resumed_from_round']}), ratio {t_fault / t_clean:.2f}x (goal <= 1.5x)"
    )
