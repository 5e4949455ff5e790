"""`zipline-dagster backfill`'s refusals. A backfill end to end (upstream first, fresh
partitions skipped, a lost model planned again) is walked in
``tests/defs/test_first_model.py``, on a newcomer's model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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


@pytest.mark.slow
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


def test_a_backfill_ends_when_its_runs_made_every_target_and_none_is_still_going() -> None:
    """``backfill --wait``'s one rule (local and through a webserver): a failed run and
    its successful retry end the wait once the retry has materialized the plan, without
    waiting for the daemon's mark; a run still queued, or a target no run made, does not.
    What the runs made is read only once none is going."""
    import dagster as dg

    from zipline_dagster.lineage.backfill import plan_done

    key = dg.AssetKey(["models", "m"])
    targets: set[tuple[dg.AssetKey, str | None]] = {(key, "2026-07-11"), (key, "2026-07-12")}
    reads = []

    def made(*parts: str):  # type: ignore[no-untyped-def]
        def read() -> list[tuple[dg.AssetKey, str]]:
            reads.append(parts)
            return [(key, p) for p in parts]

        return read

    assert plan_done(targets, ["FAILURE", "SUCCESS"], made("2026-07-11", "2026-07-12"))
    assert not plan_done(targets, ["FAILURE", "SUCCESS"], made("2026-07-11"))
    assert not plan_done(targets, ["FAILURE", "QUEUED"], made("never read"))
    assert not plan_done(None, ["SUCCESS"], made("never read"))  # the UI's: the daemon's mark
    assert not plan_done(targets, [], made("never read"))
    assert ("never read",) not in reads
