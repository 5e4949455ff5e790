"""Many small models from one table: every segment gets a model or a reported failure."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

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
    # A second of work on Ray is shorter than a worker's start: the driver trains it alone
    # and no worker is asked for (--min-pool-seconds); see the test below for the pool.
    assert report["segments_by_driver"] == SEGMENTS + 1 and report["pool_workers"] == 0
    with zipfile.ZipFile(io.BytesIO(store.read_bytes(f"{model_dir}/segment_models.zip"))) as zf:
        models = {n.removesuffix(".ubj") for n in zf.namelist()}
    assert models | set(report["segments_failed"]) == set(table)
    assert not models & set(report["segments_failed"])


@pytest.mark.ray
def test_pool_workers_share_the_work_with_the_driver(ray_head: Any, file_base: str) -> None:
    """With the pool forced on (--min-pool-seconds=0) and about 20 s of training for the
    driver alone (a worker starts in about 5 s here), a pool worker comes up while the
    driver trains and takes part of the segments; every segment still gets its model or
    its reported failure, whoever trained it."""
    segments = 3000
    write_market_table(file_base, segments)
    version = publish_trainer_archive(
        TRAINERS / "market_ctr_models", model_name="market_ctr_models", base=file_base
    ).version
    jc = {"segment-column": "market", "features": "price,noise", "min-pool-seconds": "0"}
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc, replicas=2)
    result = materialize(model, resources(ray_head.dashboard_url, file_base))
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["segments/trained"] == segments and md["segments/failed"] == 1
    report = json.loads(blob_store(file_base).read_bytes(f"{md['artifact_uri']}/metrics.json"))
    assert report["pool_workers"] == 1
    assert 0 < report["segments_by_driver"] < segments + 1  # both slots trained
    assert "empty split" in report["segments_failed"]["zz_new_market"]
    # Ray's pip env is a copy of the environment made without .pyc files, and the head
    # runs with PYTHONDONTWRITEBYTECODE=1: the jobs' processes still wrote the bytecode of
    # what they imported into it, so the next job's processes do not compile it again.
    compiled = Path(ray_head.temp_dir).glob(
        "session_*/runtime_resources/pip/*/virtualenv/lib/python3*/site-packages/"
        "xgboost/__pycache__/core.*.pyc"
    )
    assert list(compiled), "no bytecode in Ray's pip env"


def test_xgboost_is_imported_without_scikit_learn() -> None:
    """The trainer's processes import xgboost without the scikit-learn API it would pull in
    (about 3 s of CPU each); scikit-learn itself still imports afterwards."""
    code = (
        "import sys\n"
        "from trainer.fanout import import_xgboost\n"
        "xgb = import_xgboost()\n"
        "assert 'sklearn' not in sys.modules, 'imported'\n"
        "import sklearn.base\n"
        "print(xgb.__version__, sklearn.base.BaseEstimator.__name__)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=TRAINERS / "market_ctr_models",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["3.2.0", "BaseEstimator"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--max-in-flight=0", "--max-in-flight=0 is invalid; expected a whole number >= 1"),
        ("--min-pool-seconds=-1", "--min-pool-seconds=-1.0 is invalid; expected seconds >= 0"),
        ("--min-pool-seconds=nan", "--min-pool-seconds=nan is invalid; expected seconds >= 0"),
    ],
)
def test_bad_pool_flags_are_refused_by_name(tmp_path: Path, flag: str, message: str) -> None:
    flags = [
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-07",
        "--end-ds=2026-07-10",
        f"--model-dir={tmp_path.as_uri()}/model",
        f"--warehouse={tmp_path.as_uri()}",
        flag,
    ]
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", *flags],
        cwd=TRAINERS / "market_ctr_models",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert message in res.stderr
    assert not (tmp_path / "model").exists()  # nothing written
