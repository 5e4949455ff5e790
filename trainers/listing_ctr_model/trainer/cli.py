"""Flags of the reference trainer.

The platform always passes ``--input-table``, ``--start-ds``, ``--end-ds``, ``--model-dir``
and ``--warehouse``; every ``job_configs`` entry arrives as ``--key=value``. The same
command runs by hand, without Ray or Dagster.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from zipline_runtime import trainer_io as tio


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 0")
    return n


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    tio.add_platform_flags(p)
    p.add_argument(
        "--checkpoint-dir",
        default="",
        help="Ray Train checkpoints (default {model-dir}/_checkpoints); kept across attempts",
    )
    p.add_argument("--label-column", default="label")
    p.add_argument(
        "--features",
        default="",
        help="comma list 'name' or 'name:column'; default: every numeric column but the label",
    )
    p.add_argument(
        "--eval-days",
        type=_non_negative_int,
        default=1,
        help="most recent partitions held out for evaluation (a date split)",
    )
    p.add_argument("--max-depth", type=_non_negative_int, default=4)
    p.add_argument("--num-rounds", type=_non_negative_int, default=50)
    p.add_argument("--learning-rate", type=float, default=0.3)
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument(
        "--nthread", type=_non_negative_int, default=1, help="xgboost threads (in-process training)"
    )
    p.add_argument(
        "--num-workers",
        type=_non_negative_int,
        default=0,
        help="train with Ray Train on this many workers (0: in this process)",
    )
    p.add_argument(
        "--max-failures",
        type=_non_negative_int,
        default=2,
        help="worker failures Ray Train recovers from (resuming from the last checkpoint)",
    )
    p.add_argument(
        "--fail-at-round",
        type=_non_negative_int,
        default=0,
        help="fault injection for recovery tests: the last worker dies at this round once",
    )
    return tio.check_window(p, p.parse_args(argv))
