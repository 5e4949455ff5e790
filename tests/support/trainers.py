"""The reference trainer run by hand in a test."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TRAINERS


def run_trainer(*flags: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python, "-m", "trainer.train", *flags],
        cwd=TRAINERS / "listing_ctr_model",
        capture_output=True,
        text=True,
        timeout=300,
    )
