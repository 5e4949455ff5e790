"""Flags of the reference regression trainer.

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
    p.add_argument("--label-column", default="label", help="the numeric target")
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
    p.add_argument("--nthread", type=_non_negative_int, default=1, help="xgboost threads")
    return tio.check_window(p, p.parse_args(argv))
