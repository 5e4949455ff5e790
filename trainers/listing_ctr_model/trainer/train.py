"""Train the listing-CTR classifier on the days [--start-ds, --end-ds] of --input-table.

Split by date, never at random: the ``--eval-days`` most recent days are held out. Writes
``model.json`` (xgboost), ``metrics.json`` (the report) and ``pr_curve.png`` into
``--model-dir``. Run by hand: ``python -m trainer.train --input-table=ns.t ...``.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from zipline_runtime import trainer_io as tio
from zipline_runtime.training import WindowTraining, binary_labels

from trainer.cli import parse_args

log = logging.getLogger("trainer")


TrainingDataError = tio.TrainingDataError


def _class_status(y: Any, split: str) -> str | None:
    if len(y) == 0:
        return f"empty split: the {split} set has no rows"
    import numpy as np

    classes = [int(v) for v in np.unique(y)]
    if len(classes) < 2:
        who = "holdout" if split == "holdout" else "training set"
        return f"{who} has one class (every label is {classes[0]}); AUC and PR curve are undefined"
    return None


def split_metrics(y: Any, p: Any, split: str) -> tuple[dict[str, float | None], dict[str, str]]:
    """Metrics of one split and, for each metric that is missing, why."""
    names = ("auc", "logloss", "accuracy", "positive_rate")
    status: dict[str, str] = {}
    if len(y) == 0:
        reason = f"empty split: the {split} set has no rows"
        return dict.fromkeys(names), dict.fromkeys(names, reason)
    out: dict[str, float | None] = {
        "logloss": tio.log_loss(y, p),
        "accuracy": tio.accuracy(y, p),
        "positive_rate": float(y.mean()),
    }
    one_class = _class_status(y, split)
    if one_class:
        out["auc"] = None
        status["auc"] = one_class
    else:
        out["auc"] = tio.roc_auc(y, p)
    return {k: out[k] for k in names}, status


def pr_curve(y: Any, p: Any, points: int = 101) -> dict[str, list[float]]:
    import numpy as np

    precision, recall, thresholds = tio.precision_recall_curve(y, p)
    idx = np.unique(np.linspace(0, len(precision) - 1, min(points, len(precision))).astype(int))
    return {
        "precision": [round(float(v), 6) for v in precision[idx]],
        "recall": [round(float(v), 6) for v in recall[idx]],
        "thresholds": [round(float(thresholds[min(i, len(thresholds) - 1)]), 6) for i in idx],
    }


def pr_curve_png(curve: dict[str, list[float]], title: str) -> bytes:
    # matplotlib's object API (no pyplot: no GUI backend looked for, less to import)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 4), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(curve["recall"], curve["precision"])
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _fit(
    xgb: Any, data: Any, params: dict[str, Any], args: Any
) -> tuple[Any, Any, Any, dict[str, Any] | None, dict[str, Any]]:
    """The booster, the training labels and predictions, the distributed run's evidence
    and how the matrix was held."""
    import numpy as np

    if args.num_workers > 0:
        from trainer.distributed import train_distributed

        booster, distributed = train_distributed(
            dataset=data.train_dataset(),
            label=args.label_column,
            features=list(data.features),
            columns=data.columns,
            params=params | {"nthread": 1, "tree_method": "hist"},
            num_rounds=args.num_rounds,
            num_workers=args.num_workers,
            memory_budget=args.memory_budget or None,
            checkpoint_dir=args.checkpoint_dir or tio.join(args.model_dir, "_checkpoints"),
            data_fingerprint=data.fingerprint(),
            max_failures=args.max_failures,
        )
        y_train, p_train = data.predict(booster, data.train_days)
        return booster, y_train.astype(np.int8), p_train, distributed, distributed["matrix"]
    dtrain, plan = data.matrix(xgb, params["nthread"])
    y_train = dtrain.get_label().astype(np.int8)
    # A one-class training set has no base rate to estimate; 0.5 keeps xgboost defined.
    params["base_score"] = 0.5 if len(np.unique(y_train)) < 2 else float(y_train.mean())
    booster = xgb.train(params, dtrain, num_boost_round=args.num_rounds)
    p_train = booster.predict(dtrain)
    del dtrain
    data.close()
    return booster, y_train, p_train, None, plan.to_json()


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)  # a bad flag is refused before the heavy imports

    xgb = tio.import_xgboost()  # without scikit-learn: a CPU-second less in every job
    t0 = time.monotonic()
    log.info(
        "reading %s %s..%s from %s", args.input_table, args.start_ds, args.end_ds, args.warehouse
    )
    data = WindowTraining(args, label_check=binary_labels(args.input_table, args.label_column))
    features, holdout_days = data.features, data.holdout_days
    params = {
        "objective": "binary:logistic",
        "eval_metric": "logloss",
        "max_depth": args.max_depth,
        "eta": args.learning_rate,
        "seed": args.seed,
        "nthread": tio.job_threads(args.nthread),
    }
    booster, y_train, p_train, distributed, matrix = _fit(xgb, data, params, args)
    y_hold, p_hold = data.predict(booster, holdout_days)
    y_hold = y_hold.astype(int)

    train_metrics, train_status = split_metrics(y_train, p_train, "train")
    hold_metrics, hold_status = split_metrics(y_hold, p_hold, "holdout")
    status: dict[str, str] = {f"train.{k}": v for k, v in train_status.items()}
    status.update({f"holdout.{k}": v for k, v in hold_status.items()})

    gain = booster.get_score(importance_type="gain")
    total = sum(gain.values()) or 1.0
    importance = sorted(
        (
            {
                "feature": f,
                "gain": float(gain.get(f, 0.0)),
                "share": float(gain.get(f, 0.0)) / total,
            }
            for f in features
        ),
        key=lambda r: -r["gain"],
    )

    curve_split = "holdout" if _class_status(y_hold, "holdout") is None else None
    curve = pr_curve(y_hold, p_hold) if curve_split else None
    if curve is None:
        status["pr_curve"] = _class_status(y_hold, "holdout") or "holdout unavailable"

    report: dict[str, Any] = {
        "model_type": "xgboost.binary:logistic",
        **tio.report_header(args, holdout_days),
        "train": data.split_report("train", train_metrics),
        "holdout": data.split_report("holdout", hold_metrics),
        "status": status,
        # name -> column: also what the inference module (trainer.score) reads
        "features": features,
        "feature_importance": importance,
        "pr_curve": curve,
        "params": {k: v for k, v in params.items() if k != "nthread"},
        "num_rounds": args.num_rounds,
        "training_seconds": round(time.monotonic() - t0, 3),
        # what each scored day's drift (PSI) is measured against: a bounded sample of the
        # training rows' features, the predictions over the holdout
        "drift_reference": data.drift_reference(p_hold),
        "distributed": distributed,
        # how the training matrix was held (in memory, or external), and why
        "matrix": matrix,
    }

    tio.write_bytes(args.model_dir, "model.json", bytes(booster.save_raw(raw_format="json")))
    if curve is not None:
        tio.write_bytes(
            args.model_dir,
            "pr_curve.png",
            pr_curve_png(
                curve, f"{args.input_table} holdout {holdout_days[0]}..{holdout_days[-1]}"
            ),
        )
    tio.write_report(args.model_dir, report)
    log.info(
        "trained on %d rows, holdout %d rows (%s matrix); holdout auc=%s; wrote %s",
        data.train_rows,
        data.holdout_rows,
        matrix["kind"],
        hold_metrics["auc"],
        args.model_dir,
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(train, argv)


if __name__ == "__main__":
    sys.exit(main())
