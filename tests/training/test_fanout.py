"""Many small models from one table: every segment gets a model or a reported failure."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_partition
from tests.training.test_assets import (
    DS,
    TABLE,
    make_model,
    materialize,
    only_materialization,
    resources,
)
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.training.archive import publish_trainer_archive

SEGMENTS = 300


def market_rows(ds: str, segments: int, rows_per_segment: int) -> pd.DataFrame:
    rng = np.random.default_rng(int(ds.replace("-", "")))
    n = segments * rows_per_segment
    market = np.repeat([f"m{i:04d}" for i in range(segments)], rows_per_segment)
    price = rng.normal(0, 1, n)
    label = (rng.random(n) < 1 / (1 + np.exp(1.5 * price))).astype("int64")
    return pd.DataFrame(
        {"market": market, "price": price, "noise": rng.normal(0, 1, n), "label": label}
    )


def write_market_table(base: str, segments: int, rows_per_segment: int = 20) -> None:
    days = days_ending(DS, 4)
    for ds in days:
        frame = market_rows(ds, segments, rows_per_segment)
        if ds == days[-1]:  # a market that only exists on the holdout day cannot train
            bad = market_rows(ds, 1, rows_per_segment).assign(market="zz_new_market")
            frame = pd.concat([frame, bad], ignore_index=True)
        write_partition(base, TABLE, ds, frame)


def test_fan_out_trains_every_segment_or_reports_it(launcher: str | None, file_base: str) -> None:
    write_market_table(file_base, SEGMENTS)
    version = publish_trainer_archive(
        TRAINERS / "market_ctr_models", model_name="market_ctr_models", base=file_base
    ).version
    jc = {
        "segment-column": "market",
        "label-column": "label",
        "eval-days": "1",
        "features": "price,noise",
        "num-rounds": "10",
    }
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc)
    result = materialize(model, resources(launcher, file_base))
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["segments/total"] == SEGMENTS + 1
    assert md["segments/trained"] == SEGMENTS and md["segments/failed"] == 1
    assert "empty split" in md["segments/failures"]["zz_new_market"]
    table = {r.data["segment"]: r.data for r in md["segments/summary"].records}
    assert len(table) == SEGMENTS + 1 and table["zz_new_market"]["status"] == "failed"
    assert md["holdout/auc_median"] > 0.6  # each market has a real price signal

    model_dir = md["artifact_uri"]
    store = blob_store(model_dir)
    report = json.loads(store.read_bytes(f"{model_dir}/metrics.json"))
    assert report["executor"] == ("ray" if launcher else "serial")
    # the driver trains too (on Ray: between collecting its pool's results)
    by_driver = report["segments_by_driver"]
    assert (0 < by_driver <= SEGMENTS + 1) if launcher else by_driver == SEGMENTS + 1
    with zipfile.ZipFile(io.BytesIO(store.read_bytes(f"{model_dir}/segment_models.zip"))) as zf:
        models = {n.removesuffix(".ubj") for n in zf.namelist()}
    assert models | set(report["segments_failed"]) == set(table)
    assert not models & set(report["segments_failed"])


def test_bad_max_in_flight_is_refused_by_name(tmp_path: Path) -> None:
    flags = [
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-07",
        "--end-ds=2026-07-10",
        f"--model-dir={tmp_path.as_uri()}/model",
        f"--warehouse={tmp_path.as_uri()}",
        "--max-in-flight=0",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", *flags],
        cwd=TRAINERS / "market_ctr_models",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "--max-in-flight=0 is invalid; expected a whole number >= 1" in res.stderr
    assert not (tmp_path / "model").exists()  # nothing written
