"""The reference batch inference of xgboost trainers: score one day's rows of a table with
one trained model partition.

A trainer's inference module runs it (``trainer/score.py``: ``from zipline_runtime.score
import main``), as ``python -m trainer.score --input-table ns.name --ds D --model-dir URI
--output-table ns.name --warehouse URI`` (plus the platform's derived ``--write-id`` and
``--passthrough``). Reads ``model.json`` and ``metrics.json`` (its features and their
columns) from the model directory, scores every row of partition ``D`` of the input
table, and writes one parquet file into partition ``D`` of the output table: the
passthrough columns, ``score``, ``model_version``, ``model_ds`` and ``model_age_days``
(the days from the model's partition to ``D``; the partition as its manifest names it). The
platform commits
the partition after the job succeeds. Deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from zipline_runtime import trainer_io as tio

log = logging.getLogger("zipline_runtime.score")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.score", description=__doc__)
    tio.add_inference_flags(p)
    return p.parse_args(argv)


def score(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import numpy as np

    args = parse_args(argv)
    xgb = tio.import_xgboost()  # without scikit-learn: a CPU-second less in every job
    fs, model_path = tio.filesystem(args.model_dir)
    booster = xgb.Booster()
    booster.load_model(bytearray(fs.cat_file(f"{model_path}/model.json")))
    # The booster keeps its features' order; the report maps each name to its column.
    report = json.loads(fs.cat_file(f"{model_path}/metrics.json"))
    mapping = report["features"] if isinstance(report["features"], dict) else {}
    names = list(booster.feature_names or [])
    columns = [mapping.get(n, n) for n in names]
    passthrough = tio.column_list(args.passthrough)
    data = tio.read_window(
        args.warehouse,
        args.input_table,
        [args.ds],
        args.partition_column,
        sorted(set(columns) | set(passthrough)),
        metadata=args.table_metadata,
        snapshot_id=args.snapshot_id,
    )
    matrix = xgb.DMatrix(data[columns].to_numpy(dtype=float), feature_names=names)
    partition = tio.committed_partition(args.model_dir)
    out = data[passthrough].copy()
    out["score"] = booster.predict(matrix).astype(np.float64)
    out["model_version"] = partition.version
    out["model_ds"] = partition.ds
    out["model_age_days"] = (dt.date.fromisoformat(args.ds) - partition.day).days
    # the day's drift against the training window (features) and the holdout (predictions)
    drift = tio.drift_of(
        report.get("drift_reference"), data, dict(zip(names, columns, strict=True)), out["score"]
    )
    uri = tio.write_table_file(
        args.warehouse, args.output_table, args.ds, args.write_id, out, drift=drift
    )
    log.info(
        "scored %d rows of %s %s with %s; wrote %s",
        len(out),
        args.input_table,
        args.ds,
        args.model_dir,
        uri,
    )
    return {"rows": len(out), "uri": uri}


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(score, argv)


if __name__ == "__main__":
    sys.exit(main())
