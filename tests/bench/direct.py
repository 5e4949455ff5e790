"""A trainer run by hand, the baseline the overhead benchmarks compare with."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TRAINERS


def direct_run(argv: list[str]) -> None:
    subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=TRAINERS / "listing_ctr_model",
        check=True,
        capture_output=True,
    )
