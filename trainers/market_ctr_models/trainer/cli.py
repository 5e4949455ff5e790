"""Flags of the fan-out trainer (platform flags + its own job_configs keys)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from zipline_runtime import trainer_io as tio


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    tio.add_platform_flags(p)
    p.add_argument("--segment-column", default="market")
    p.add_argument("--label-column", default="label")
    p.add_argument("--features", default="", help="comma list; default every numeric column")
    p.add_argument("--eval-days", type=int, default=1)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--num-rounds", type=int, default=20)
    p.add_argument(
        "--executor",
        choices=["auto", "ray", "serial"],
        default="auto",
        help="auto: the driver and a Ray actor pool when running on a Ray cluster, else a "
        "serial loop",
    )
    p.add_argument(
        "--min-pool-seconds",
        type=float,
        default=10.0,
        help="start the Ray workers only when the driver alone would need longer than this "
        "(from the segment count, at least 1 ms each, else timed on a first batch of 16): "
        "a cold worker takes seconds to start; 0: always",
    )
    p.add_argument(
        "--driver-threads",
        type=int,
        default=0,
        help="threads the driver trains on (0: alone, --num-workers when given, else the CPUs "
        "Ray reserved for the job's driver; beside workers, those CPUs; at most this node's "
        "CPUs and 4); 1: one model at a time, as the serial loop",
    )
    p.add_argument("--batch-size", type=int, default=0, help="segments per batch (0: auto)")
    p.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="parallel training slots, the driver being one (0: the driver and a worker per "
        "CPU free on the cluster)",
    )
    p.add_argument("--max-in-flight", type=int, default=2, help="batches in flight per worker")
    p.add_argument(
        "--task-retries", type=int, default=2, help="retries of a batch whose worker died"
    )
    p.add_argument(
        "--checkpoint-dir",
        default="",
        help="passed by the platform to trainers with Ray workers; unused here (a segment "
        "that fails is retrained whole, its models are seconds long)",
    )
    args = p.parse_args(argv)
    if not args.min_pool_seconds >= 0:  # also refuses nan
        p.error(f"--min-pool-seconds={args.min_pool_seconds} is invalid; expected seconds >= 0")
    if args.driver_threads < 0:
        p.error(f"--driver-threads={args.driver_threads} is invalid; expected a whole number >= 0")
    if args.max_in_flight < 1:
        p.error(f"--max-in-flight={args.max_in_flight} is invalid; expected a whole number >= 1")
    return tio.check_window(p, args)
