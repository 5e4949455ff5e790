"""`zipline-dagster backfill`'s refusals. A backfill end to end (upstream first, fresh
partitions skipped, a lost model planned again) is walked in
``tests/defs/test_first_model.py``, on a newcomer's model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import BIN, ROOT


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "zipline-dagster"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_backfill_refuses_unknown_model_and_bad_dates(tmp_path: Path) -> None:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "ZIPLINE_HOME": str(tmp_path / "z")}
    res = cli(
        env, "backfill", "no_such_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "no asset 'models/no_such_model'" in res.stderr
    assert "models/listing_ctr_model" in res.stderr
    res = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2020-01-01", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "--start-ds='2020-01-01' is not a partition" in res.stderr
    res = cli(
        env, "backfill", "listing_ctr_model", "--start-ds", "2026-07-12", "--end-ds", "2026-07-11"
    )
    assert res.returncode == 1 and "is after" in res.stderr
