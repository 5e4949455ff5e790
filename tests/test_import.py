"""The code location must import without starting (or even importing) Ray or Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "zipline_dagster",
        "zipline_dagster.cli",
        "zipline_dagster.jobs.archive",
        "zipline_dagster.storage.blobs",
    ],
)
def test_import_does_not_pull_ray_or_spark(module: str) -> None:
    code = (
        f"import {module}, sys; "
        "heavy = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('ray', 'pyspark', 'xgboost')); "
        "print(','.join(heavy))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""
