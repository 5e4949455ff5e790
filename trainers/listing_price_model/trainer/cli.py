"""Flags of the reference regression trainer.

The platform always passes ``--input-table``, ``--start-ds``, ``--end-ds``, ``--model-dir``
and ``--warehouse``; every ``job_configs`` entry arrives as ``--key=value``. The same
command runs by hand, without Ray or Dagster.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from zipline_runtime import trainer_io as tio


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    tio.add_platform_flags(p)
    tio.add_training_flags(p, label_help="the numeric target")
    return tio.check_window(p, p.parse_args(argv))
