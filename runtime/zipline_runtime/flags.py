"""The trainer contract's flags, as argparse reads them: the platform's (never user-set,
or derived), the inference module's, and the ones the reference xgboost trainers share.
Re-exported by ``zipline_runtime.trainer_io`` (``tio.add_platform_flags`` ...)."""

from __future__ import annotations

import argparse

from zipline_runtime.tables import checked_day as _day


def add_platform_flags(p: argparse.ArgumentParser) -> None:
    """The flags the platform passes every trainer (never user-set, or derived)."""
    p.add_argument("--input-table", required=True, help="training table, ns.name")
    p.add_argument("--start-ds", required=True, type=_day, help="first partition, inclusive")
    p.add_argument("--end-ds", required=True, type=_day, help="last partition, inclusive")
    p.add_argument(
        "--model-dir", required=True, help="output URI (file:///..., s3://..., or a path)"
    )
    p.add_argument("--warehouse", required=True, help="warehouse root URI holding ns/name/ds=.../")
    p.add_argument(
        "--columns",
        default="",
        help="comma list: read only these columns (the model's selects); default: all",
    )
    _add_table_flags(p)


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partition-column", default="ds")
    p.add_argument(
        "--table-metadata",
        default=None,
        help="the input table's Iceberg metadata file (platform-set; by hand: its newest)",
    )
    p.add_argument(
        "--snapshot-id",
        type=int,
        default=None,
        help="the snapshot to read (platform-set: the one resolved for the window)",
    )


def non_negative_int(value: str) -> int:
    """An argparse type: a whole number >= 0, else an error naming the value."""
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 0")
    return n


def add_training_flags(p: argparse.ArgumentParser, *, label_help: str = "the label") -> None:
    """The flags the reference xgboost trainers share (each a ``job_configs`` key): the
    label and feature columns, the date split and xgboost's parameters."""
    p.add_argument("--label-column", default="label", help=label_help)
    p.add_argument(
        "--features",
        default="",
        help="comma list 'name' or 'name:column'; default: every numeric column but the label",
    )
    p.add_argument(
        "--eval-days",
        type=non_negative_int,
        default=1,
        help="most recent partitions held out for evaluation (a date split)",
    )
    p.add_argument("--max-depth", type=non_negative_int, default=4)
    p.add_argument("--num-rounds", type=non_negative_int, default=50)
    p.add_argument("--learning-rate", type=float, default=0.3)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument(
        "--nthread",
        type=non_negative_int,
        default=0,
        help="xgboost threads (in-process training); 0: the CPUs the job was given",
    )
    p.add_argument(
        "--memory-budget",
        type=non_negative_int,
        default=0,
        help="bytes the training matrix may hold (platform-set from ResourceConfig."
        "memory_per_replica); beyond it, external memory on local disk. 0: no budget",
    )
    add_batch_rows_flag(p)


def add_batch_rows_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-rows",
        type=non_negative_int,
        default=0,
        help="rows read (and scored) at once; 0: the runtime's default",
    )


def check_window(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.start_ds > args.end_ds:
        p.error(f"--start-ds={args.start_ds} is after --end-ds={args.end_ds}")
    return args


def add_inference_flags(p: argparse.ArgumentParser) -> None:
    """The flags the platform passes an inference module (``ModelTransforms``)."""
    p.add_argument("--input-table", required=True, help="table to score, ns.name")
    p.add_argument("--ds", required=True, type=_day, help="the partition to score")
    p.add_argument("--model-dir", required=True, help="the trained model partition's URI")
    p.add_argument("--output-table", required=True, help="scores table, ns.name")
    p.add_argument("--warehouse", required=True, help="warehouse root URI")
    p.add_argument("--write-id", required=True, help="names the output file (platform-set)")
    p.add_argument("--passthrough", default="", help="comma list: source columns to copy")
    _add_table_flags(p)
    add_batch_rows_flag(p)
