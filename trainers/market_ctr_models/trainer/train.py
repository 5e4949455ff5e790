"""Train one model per segment of --input-table over [--start-ds, --end-ds].

Writes ``segment_models.zip`` (one xgboost model per segment) and ``metrics.json`` with
per-segment metrics, every failed segment with its error, and a summary.
"""

from __future__ import annotations

import io
import logging
import os
import statistics
import sys
import time
import zipfile
from collections.abc import Sequence
from typing import Any

from zipline_runtime import trainer_io as tio

from trainer.cli import parse_args
from trainer.fanout import PoolStart, pool_wanted, run_ray, run_serial

log = logging.getLogger("trainer")


def segment_codes(table: Any, column: str) -> tuple[Any, list[str]]:
    """Each row's segment as a number (0.. in name order) and the names, from the
    dictionary-encoded segment column: no Python string per row. A null segment is named
    "None"."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(column).combine_chunks()  # one dictionary (WindowFiles.read_table unifies)
    if not pa.types.is_dictionary(col.type):  # e.g. integer ids (parquet dictionary-reads
        col = pc.dictionary_encode(col)  # strings only)
    names = [str(v) for v in col.dictionary.to_pylist()]
    idx = col.indices
    if col.null_count:
        idx = pc.fill_null(idx, len(names))
        names.append("None")
    ordered = sorted(set(names))  # by name; distinct values that print alike are one segment
    rank = {n: i for i, n in enumerate(ordered)}
    codes = np.array([rank[n] for n in names], dtype="int64")[idx.to_numpy()]
    present = np.bincount(codes, minlength=len(ordered)) > 0  # dictionary values unused
    if not present.all():
        codes = (np.cumsum(present) - 1)[codes]
        ordered = [n for n, p in zip(ordered, present.tolist(), strict=True) if p]
    return codes, ordered


def split_by_segment(
    head: Any,
    body: Any,
    codes: Any,
    names: list[str],
    args: Any,
    features: list[str],
    holdout: list[str],
) -> dict[str, dict[str, Any]]:
    """One dict of arrays per segment (``x``, ``y`` and ``hold``: its rows of the holdout
    days), sorted by segment name: the label and the day from ``head``, the features from
    ``body`` (the same rows, in the same order). Vectorised: each column becomes one
    array, reordered by segment once, and each segment gets slices of those arrays (a
    per-group loop would cost per segment: seconds at 10k)."""
    import numpy as np

    if len(head) != len(body):  # two reads of the same files: a file changed in between
        raise tio.TrainingDataError(
            f"table {args.input_table} changed while it was read ({len(head)} rows, then "
            f"{len(body)}); run again"
        )
    # a stable sort of small integers is a radix sort (linear), of int64 a merge sort
    small = codes.astype("uint16") if len(names) <= 1 << 16 else codes
    order = np.argsort(small, kind="stable")
    # The matrix is filled column by column, each column gathered straight into place:
    # one matrix in memory besides the table, where stacking the columns and then
    # reordering the rows would make two more.
    x = np.empty((len(order), len(features)), dtype="float64")
    for j, f in enumerate(features):
        column = body.column(f).to_numpy()
        if column.dtype == x.dtype:
            np.take(column, order, out=x[:, j], mode="clip")  # "clip": no buffered copy
        else:  # integers, booleans: cast as they are copied
            x[:, j] = column[order]
        del column
    y = head.column(args.label_column).to_numpy().astype("int64", copy=False)[order]
    days = head.column(args.partition_column).combine_chunks()
    is_holdout = np.isin(np.array(days.dictionary.to_pylist(), dtype=object), holdout)
    hold = is_holdout[days.indices.to_numpy()][order]
    ends = np.cumsum(np.bincount(codes, minlength=len(names)))
    out, start = {}, 0
    for name, end in zip(names, ends.tolist(), strict=True):
        out[name] = {"x": x[start:end], "y": y[start:end], "hold": hold[start:end]}
        start = end
    return out


def check_columns(schema: Any, args: Any, features: list[str]) -> None:
    """The segment, label and feature columns exist (in the table's ``schema``)."""
    have = sorted(c for c in schema.names if c != args.partition_column)
    for column, flag in ((args.segment_column, "segment"), (args.label_column, "label")):
        if column not in have:
            raise tio.TrainingDataError(
                f"table {args.input_table} has no column {column!r} (--{flag}-column); "
                f"it has {have}"
            )
    absent = [f for f in features if f not in have]
    if absent:
        raise tio.TrainingDataError(
            f"table {args.input_table} has no columns {absent} (--features); it has {have}"
        )
    if not features:
        raise tio.TrainingDataError(
            f"table {args.input_table} has no numeric columns to train on besides "
            f"{args.segment_column!r} and {args.label_column!r}; it has {have}"
        )


def check_labels(head: Any, args: Any) -> None:
    """Every row has a label."""
    empty = head.column(args.label_column).null_count
    if empty:
        raise tio.TrainingDataError(
            f"table {args.input_table}: the label column {args.label_column!r} "
            f"(--label-column) has {empty} empty rows; every row needs a 0/1 label"
        )


def numeric_columns(schema: Any, skip: set[str]) -> list[str]:
    """The ``schema``'s numeric columns (integers, floats, booleans) not in ``skip``."""
    import pyarrow as pa

    def numeric(t: Any) -> bool:
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))

    return [f.name for f in schema if f.name not in skip and numeric(f.type)]


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started, started_cpu = time.monotonic(), time.process_time()
    use_ray = args.executor == "ray" or (args.executor == "auto" and os.environ.get("RAY_ADDRESS"))
    # The driver trains too, so it is one of the slots; the pool's workers start (cold, in
    # a fresh job) only once the data says they are worth it.
    pool = PoolStart(args.num_workers, args.task_retries) if use_ray else None
    window = tio.window_days(args.start_ds, args.end_ds)
    holdout = window[len(window) - args.eval_days :] if args.eval_days else []
    # The window's files are listed once and read in two steps: the segment and label
    # columns first, which say how many models there are, so that the workers (when
    # wanted) start while the features are read and split, not after.
    files = tio.flags_window_files(args)
    schema = files.schema
    skip = {args.segment_column, args.label_column, args.partition_column}
    features = (
        [f.strip() for f in args.features.split(",") if f.strip()]
        if args.features
        else numeric_columns(schema, skip)
    )
    check_columns(schema, args, features)  # before any worker is asked for
    head = files.read_table([args.segment_column, args.label_column], (args.segment_column,))
    check_labels(head, args)
    codes, names = segment_codes(head, args.segment_column)
    if pool is not None and pool_wanted(len(names), args.min_pool_seconds):
        pool.start()  # the workers start while the features are read and split
    body = files.read_table(features)
    segments = split_by_segment(head, body, codes, names, args, features, holdout)
    del head, body, codes
    conf = {"max_depth": args.max_depth, "num_rounds": args.num_rounds}
    load_seconds = time.monotonic() - started
    load_cpu_seconds = time.process_time() - started_cpu
    t0 = time.monotonic()
    pool_stats: dict[str, Any] = {}
    if pool is not None:
        results = list(
            run_ray(
                segments,
                conf,
                pool=pool,
                min_pool_seconds=args.min_pool_seconds,
                threads=args.driver_threads,
                batch_size=args.batch_size,
                max_in_flight=args.max_in_flight,
                task_retries=args.task_retries,
                log=log.info,
                stats=pool_stats,
            )
        )
    else:
        results = list(run_serial(segments, conf))
    fanout_seconds = time.monotonic() - t0

    trained = sorted((r for r in results if "error" not in r), key=lambda r: r["segment"])
    failed = {r["segment"]: r["error"] for r in results if "error" in r}
    missing = sorted(set(segments) - {r["segment"] for r in results})
    for seg in missing:  # never silently dropped
        failed[seg] = "no result came back for this segment"

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for r in trained:
            info = zipfile.ZipInfo(f"{r['segment']}.ubj", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, r["model"])
    if trained:
        tio.write_bytes(args.model_dir, "segment_models.zip", buf.getvalue())

    aucs = [r["metrics"]["holdout_auc"] for r in trained if "holdout_auc" in r["metrics"]]
    train_days = [d for d in window if d not in holdout]
    report = {
        "model_type": "xgboost.binary:logistic per segment",
        **tio.report_header(args, holdout),
        "executor": "ray" if use_ray else "serial",
        "fanout_seconds": round(fanout_seconds, 3),
        # reading and splitting the data (workers warm up meanwhile), then the fan-out
        "load_seconds": round(load_seconds, 3),
        # the CPU this process spent meanwhile, every thread of it (pyarrow's reading
        # threads; with Ray, the pool's start in the background too)
        "load_cpu_seconds": round(load_cpu_seconds, 3),
        "train_seconds": round(load_seconds + fanout_seconds, 3),
        "train": {
            "rows": int(sum(r["metrics"]["train_rows"] for r in trained)),
            "date_range": {
                "start": train_days[0] if train_days else None,
                "end": train_days[-1] if train_days else None,
            },
            "metrics": {},
        },
        "holdout": {
            "rows": int(sum(r["metrics"]["holdout_rows"] for r in trained)),
            "date_range": {
                "start": holdout[0] if holdout else None,
                "end": holdout[-1] if holdout else None,
            },
            "metrics": {
                "auc_median": statistics.median(aucs) if aucs else None,
                "auc_mean": statistics.fmean(aucs) if aucs else None,
            },
        },
        "status": {} if aucs else {"holdout.auc_median": "no segment has a holdout AUC"},
        "segments_total": len(segments),
        "segments_trained": len(trained),
        "segments_failed": failed,
        # how the work was shared: the driver trains between collecting the workers' results;
        # the workers are started only for work that outlasts their start (--min-pool-seconds)
        "segments_by_driver": sum(1 for r in results if r.get("pid") == os.getpid()),
        "pool_workers": len(pool.workers or []) if pool is not None else 0,
        # when the driver saw the first worker up (seconds into the fan-out) and the
        # segments done by then: the rest the slots trained together (null: none came up)
        "pool_first_up_seconds": (
            round(pool_stats["first_up_seconds"], 3)
            if pool_stats.get("first_up_seconds") is not None
            else None
        ),
        "segments_before_pool_up": pool_stats.get("done_before_up", 0),
        # threads the driver trained on: alone, its slots or CPUs; beside workers, its CPUs
        "driver_threads": pool_stats.get("driver_threads", 1),
        # why no worker trained although they were asked for (null: none asked, or fine)
        "pool_error": pool_stats.get("pool_error"),
        "segments": [
            {"segment": r["segment"], **r["metrics"], "status": r["status"]} for r in trained
        ],
        "features": features,
    }
    tio.write_report(args.model_dir, report)
    log.info(
        "trained %d of %d segments (%d failed) in %.1fs",
        len(trained),
        len(segments),
        len(failed),
        fanout_seconds,
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(train, argv, succeeded=lambda report: report["segments_trained"])


if __name__ == "__main__":
    sys.exit(main())
