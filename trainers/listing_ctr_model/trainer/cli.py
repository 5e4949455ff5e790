"""Flags of the reference trainer.

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
    p.add_argument(
        "--checkpoint-dir",
        default="",
        help="Ray Train checkpoints (default {model-dir}/_checkpoints); kept across attempts",
    )
    tio.add_training_flags(p)
    p.add_argument(
        "--num-workers",
        type=tio.non_negative_int,
        default=0,
        help="train with Ray Train on this many workers (0: in this process)",
    )
    p.add_argument(
        "--max-failures",
        type=tio.non_negative_int,
        default=2,
        help="worker failures Ray Train recovers from (resuming from the last checkpoint)",
    )
    return tio.check_window(p, p.parse_args(argv))
