"""Train the listing price regressor on the days [--start-ds, --end-ds] of --input-table.

Split by date, never at random: the ``--eval-days`` most recent days are held out. Writes
``model.json`` (xgboost) and ``metrics.json`` (the report: RMSE, MAE and R² of each split,
a ``status`` for each that is undefined) into ``--model-dir``. Run by hand: ``python -m
trainer.train --input-table=ns.t --label-column=price_log ...``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from zipline_runtime import trainer_io as tio

from trainer.cli import parse_args

log = logging.getLogger("trainer")

TrainingDataError = tio.TrainingDataError
METRICS = ("rmse", "mae", "r2", "mean_label")


def split_metrics(y: Any, p: Any, split: str) -> tuple[dict[str, float | None], dict[str, str]]:
    """RMSE, MAE, R² and the mean label of one split and, for each that is missing, why."""
    if len(y) == 0:
        reason = f"empty split: the {split} set has no rows"
        return dict.fromkeys(METRICS), dict.fromkeys(METRICS, reason)
    out: dict[str, float | None] = {
        "rmse": tio.rmse(y, p),
        "mae": tio.mae(y, p),
        "mean_label": float(y.mean()),
        "r2": None,
    }
    status: dict[str, str] = {}
    if float(y.min()) == float(y.max()):
        status["r2"] = f"every {split} label is {y[0]:g}: R² is undefined"
    else:
        out["r2"] = tio.r2(y, p)
    return {k: out[k] for k in METRICS}, status


def _range(ds_values: list[str]) -> dict[str, str | None]:
    if not ds_values:
        return {"start": None, "end": None}
    return {"start": min(ds_values), "end": max(ds_values)}


def _label(frame: Any, column: str, table: str) -> Any:
    import pandas as pd

    if not pd.api.types.is_numeric_dtype(frame[column]):
        raise TrainingDataError(
            f"label column {column!r} of {table} is {frame[column].dtype}, not numeric: a "
            "regressor's label is a number"
        )
    return frame[column].astype(float).to_numpy()


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)  # a bad flag is refused before the heavy imports

    import numpy as np

    xgb = tio.import_xgboost()  # without scikit-learn: a CPU-second less in every job
    t0 = time.monotonic()
    window = tio.window_days(args.start_ds, args.end_ds)
    eval_days = min(args.eval_days, len(window))
    holdout_days = window[len(window) - eval_days :] if eval_days else []
    train_days = window[: len(window) - eval_days]
    data = tio.read_flags_window(args)
    if args.label_column not in data.columns:
        raise TrainingDataError(
            f"label column {args.label_column!r} is not in {args.input_table}; "
            f"columns: {sorted(data.columns)}"
        )
    features = tio.feature_columns(data, args.features, args.label_column, args.partition_column)
    if not features:
        raise TrainingDataError(f"{args.input_table} has no numeric feature columns")
    part = data[args.partition_column]
    train_df, hold_df = data[part.isin(train_days)], data[part.isin(holdout_days)]
    if train_df.empty:
        raise TrainingDataError(
            f"empty split: the training set is empty (window {window[0]}..{window[-1]}, "
            f"eval-days={args.eval_days} holds out {holdout_days}); widen the window or "
            "lower eval-days"
        )
    cols = list(features.values())
    y_train = _label(train_df, args.label_column, args.input_table)
    y_hold = _label(hold_df, args.label_column, args.input_table)
    dtrain = xgb.DMatrix(
        train_df[cols].to_numpy(dtype=float), label=y_train, feature_names=list(features)
    )
    params = {
        "objective": "reg:squarederror",
        "eval_metric": "rmse",
        "max_depth": args.max_depth,
        "eta": args.learning_rate,
        "seed": args.seed,
        "nthread": args.nthread,
        "base_score": float(y_train.mean()),
    }
    booster = xgb.train(params, dtrain, num_boost_round=args.num_rounds)
    p_train = booster.predict(dtrain)
    p_hold = (
        booster.predict(
            xgb.DMatrix(hold_df[cols].to_numpy(dtype=float), feature_names=list(features))
        )
        if len(hold_df)
        else np.array([])
    )
    train_metrics, train_status = split_metrics(y_train, p_train, "train")
    hold_metrics, hold_status = split_metrics(y_hold, p_hold, "holdout")
    status = {f"train.{k}": v for k, v in train_status.items()}
    status.update({f"holdout.{k}": v for k, v in hold_status.items()})
    gain = booster.get_score(importance_type="gain")
    total = sum(gain.values()) or 1.0
    importance = sorted(
        (
            {"feature": f, "gain": float(gain.get(f, 0.0)), "share": gain.get(f, 0.0) / total}
            for f in features
        ),
        key=lambda r: -r["gain"],
    )
    report: dict[str, Any] = {
        "task": "regression",
        "model_type": "xgboost.reg:squarederror",
        **tio.report_header(args, holdout_days),
        "train": {
            "rows": len(train_df),
            "date_range": _range(sorted(set(train_df[args.partition_column]))),
            "metrics": train_metrics,
        },
        "holdout": {
            "rows": len(hold_df),
            "date_range": _range(sorted(set(hold_df[args.partition_column]))),
            "metrics": hold_metrics,
        },
        "status": status,
        # name -> column: also what the inference module (trainer.score) reads
        "features": features,
        "feature_importance": importance,
        "pr_curve": None,  # a regressor has none
        "params": {k: v for k, v in params.items() if k != "nthread"},
        "num_rounds": args.num_rounds,
        "training_seconds": round(time.monotonic() - t0, 3),
        # what each scored day's drift (PSI) is measured against: the features over the
        # training rows, the predictions over the holdout
        "drift_reference": tio.drift_reference(train_df, features, p_hold),
    }
    tio.write_bytes(args.model_dir, "model.json", bytes(booster.save_raw(raw_format="json")))
    tio.write_report(args.model_dir, report)
    log.info(
        "trained on %d rows, holdout %d rows; holdout rmse=%s; wrote %s",
        len(train_df),
        len(hold_df),
        hold_metrics["rmse"],
        args.model_dir,
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(train, argv)


if __name__ == "__main__":
    sys.exit(main())
