"""Flags of the fan-out trainer (platform flags + its own job_configs keys)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    p.add_argument("--input-table", required=True)
    p.add_argument("--start-ds", required=True)
    p.add_argument("--end-ds", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--warehouse", required=True)
    p.add_argument("--segment-column", default="market")
    p.add_argument(
        "--columns",
        default="",
        help="comma list: read only these columns (the model's selects); default: all",
    )
    p.add_argument("--label-column", default="label")
    p.add_argument("--partition-column", default="ds")
    p.add_argument("--features", default="", help="comma list; default every numeric column")
    p.add_argument("--eval-days", type=int, default=1)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--num-rounds", type=int, default=20)
    p.add_argument(
        "--executor",
        choices=["auto", "ray", "serial"],
        default="auto",
        help="auto: Ray tasks when running on a Ray cluster, else a serial loop",
    )
    p.add_argument("--batch-size", type=int, default=0, help="segments per task (0: auto)")
    p.add_argument(
        "--num-workers", type=int, default=0, help="parallel task slots (0: the cluster's CPUs)"
    )
    p.add_argument("--max-in-flight", type=int, default=0, help="tasks in flight (0: 2 x workers)")
    p.add_argument(
        "--task-retries", type=int, default=2, help="retries of a task whose worker died"
    )
    args = p.parse_args(argv)
    if args.start_ds > args.end_ds:
        p.error(f"--start-ds={args.start_ds} is after --end-ds={args.end_ds}")
    return args
