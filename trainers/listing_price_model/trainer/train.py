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
from zipline_runtime.training import WindowTraining

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


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)  # a bad flag is refused before the heavy imports

    xgb = tio.import_xgboost()  # without scikit-learn: a CPU-second less in every job
    t0 = time.monotonic()
    data = WindowTraining(args)
    features, holdout_days = data.features, data.holdout_days
    params = {
        "objective": "reg:squarederror",
        "eval_metric": "rmse",
        "max_depth": args.max_depth,
        "eta": args.learning_rate,
        "seed": args.seed,
        "nthread": tio.job_threads(args.nthread),
    }
    dtrain, plan = data.matrix(xgb, params["nthread"])
    y_train = dtrain.get_label().astype(float)
    params["base_score"] = float(y_train.mean())
    booster = xgb.train(params, dtrain, num_boost_round=args.num_rounds)
    p_train = booster.predict(dtrain)
    del dtrain
    data.close()
    y_hold, p_hold = data.predict(booster, holdout_days)
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
        "train": data.split_report("train", train_metrics),
        "holdout": data.split_report("holdout", hold_metrics),
        "status": status,
        # name -> column: also what the inference module (trainer.score) reads
        "features": features,
        "feature_importance": importance,
        "pr_curve": None,  # a regressor has none
        "params": {k: v for k, v in params.items() if k != "nthread"},
        "num_rounds": args.num_rounds,
        "training_seconds": round(time.monotonic() - t0, 3),
        # what each scored day's drift (PSI) is measured against: a bounded sample of the
        # training rows' features, the predictions over the holdout
        "drift_reference": data.drift_reference(p_hold),
        # how the training matrix was held (in memory, or external), and why
        "matrix": plan.to_json(),
    }
    tio.write_bytes(args.model_dir, "model.json", bytes(booster.save_raw(raw_format="json")))
    tio.write_report(args.model_dir, report)
    log.info(
        "trained on %d rows, holdout %d rows (%s matrix); holdout rmse=%s; wrote %s",
        data.train_rows,
        data.holdout_rows,
        plan.kind,
        hold_metrics["rmse"],
        args.model_dir,
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(train, argv)


if __name__ == "__main__":
    sys.exit(main())
