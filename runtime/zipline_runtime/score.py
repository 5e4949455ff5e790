"""The reference batch inference of xgboost trainers: score one day's rows of a table with
one trained model partition.

A trainer's inference module runs it (``trainer/score.py``: ``from zipline_runtime.score
import main``), as ``python -m trainer.score --input-table ns.name --ds D --model-dir URI
--output-table ns.name --warehouse URI`` (plus the platform's derived ``--write-id`` and
``--passthrough``). Reads ``model.json`` and ``metrics.json`` (its features and their
columns) from the model directory, scores every row of partition ``D`` of the input
table batch by batch (``--batch-rows``; the model loaded once) and writes parquet files
into partition ``D`` of the output table (one per ``FILE_BATCHES`` batches): the
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
#: Batches a staged file holds at most: a day larger than that is written as several files.
FILE_BATCHES = 4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.score", description=__doc__)
    tio.add_inference_flags(p)
    return p.parse_args(argv)


def score(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa

    args = parse_args(argv)
    xgb = tio.import_xgboost()  # without scikit-learn: a CPU-second less in every job
    fs, model_path = tio.filesystem(args.model_dir)
    booster = xgb.Booster()  # loaded once, for every batch of the day
    booster.load_model(bytearray(fs.cat_file(f"{model_path}/model.json")))
    booster.set_param({"nthread": tio.job_threads(0)})
    # The booster keeps its features' order; the report maps each name to its column.
    report = json.loads(fs.cat_file(f"{model_path}/metrics.json"))
    mapping = report["features"] if isinstance(report["features"], dict) else {}
    names = list(booster.feature_names or [])
    columns = [mapping.get(n, n) for n in names]
    passthrough = tio.column_list(args.passthrough)
    files = tio.WindowFiles(
        args.warehouse,
        args.input_table,
        [args.ds],
        args.partition_column,
        sorted(set(columns) | set(passthrough)),
        metadata=args.table_metadata,
        snapshot_id=args.snapshot_id,
    )
    day = tio.WindowStream(files, batch_rows=args.batch_rows or tio.BATCH_ROWS)
    day.check()  # a missing day, or one without rows, as a whole read fails
    partition = tio.committed_partition(args.model_dir)
    drift = tio.DriftCounts(report.get("drift_reference"), dict(zip(names, columns, strict=True)))
    age = (dt.date.fromisoformat(args.ds) - partition.day).days
    writer = tio.StagedDay(
        args.warehouse,
        args.output_table,
        args.ds,
        args.write_id,
        file_rows=FILE_BATCHES * day.batch_rows,
    )
    for _, batch in day.batches(files.projection):
        scores = booster.inplace_predict(tio.as_matrix(batch, columns)).astype(np.float64)
        drift.add(batch, scores)
        n = batch.num_rows
        out = pa.table(
            {
                **{c: batch.column(c) for c in passthrough},
                "score": scores,
                "model_version": pa.array([partition.version] * n, pa.string()),
                "model_ds": pa.array([partition.ds] * n, pa.string()),
                "model_age_days": pa.array(np.full(n, age, dtype=np.int64)),
            }
        )
        writer.add(out)
    # the day's drift against the training window (features) and the holdout (predictions)
    uris = writer.close(drift=drift.result())
    log.info(
        "scored %d rows of %s %s with %s in %d batches; wrote %d files under %s",
        writer.rows,
        args.input_table,
        args.ds,
        args.model_dir,
        writer.batches,
        len(uris),
        uris[0].rsplit("/", 1)[0] if uris else "-",
    )
    # ``uri``: the file holding the day's drift (its last)
    return {"rows": writer.rows, "uri": uris[-1], "uris": uris}


def main(argv: Sequence[str] | None = None) -> int:
    return tio.run_main(score, argv)


if __name__ == "__main__":
    sys.exit(main())
