"""Distributed training with Ray Train V2 on a real two-node cluster: each worker reads
its own shard of the window, and with a worker killed mid-training the run recovers from
its last checkpoint and scores as a clean run does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, faulty_trainer, write_table
from tests.support.training import (
    DS,
    TABLE,
    make_model,
    materialize,
    only_materialization,
    resources,
)
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.storage.blobs import blob_store

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROUNDS = 10
TOLERANCE = 1e-6  # same data, same shards, deterministic hist: resumed == uninterrupted


def run(
    ray: Any, base: str, version: str, model_dir: str, module: str = "trainer.train"
) -> dict[str, Any]:
    jc = {
        "label-column": "label",
        "eval-days": "1",
        "features": "price_log,inventory_count",
        "num-rounds": str(ROUNDS),
        "model-dir": model_dir,
    }
    model = make_model(version, base, job_configs=jc, replicas=2, python_module=module)
    # This cluster's nodes run this environment, which has the trainer's requirements:
    # skip building Ray's pip env on both nodes (its caching is tested on one node).
    res = resources(ray.dashboard_url, base, install_requirements=False)
    result = materialize(model, res)
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    return {
        "md": md,
        "report": json.loads(blob_store(model_dir).read_bytes(f"{model_dir}/metrics.json")),
    }


def test_worker_killed_mid_training_recovers_from_checkpoint(
    ray_two_nodes: Any, file_base: str, tmp_path: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=2000)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version

    clean = run(ray_two_nodes, file_base, version, f"{file_base}/runs/clean")
    dist = clean["report"]["distributed"]
    assert dist["world_size"] == 2 and len(dist["nodes"]) == 2  # one worker on each node
    assert {w["rank"] for w in dist["worker_starts"]} == {0, 1}
    assert dist["resumed_from_round"] == 0
    # each worker read its own shard of the training days (Ray Data, get_dataset_shard),
    # and the shards add up to them: the rows, and the sums of the label and a feature
    train = pd.concat([ctr_rows(ds, 2000) for ds in days_ending(DS, 4)[:-1]])
    shards = dist["shards"]
    assert len(shards) == 2 and all(s["rows"] > 0 for s in shards), shards
    assert sum(s["rows"] for s in shards) == len(train) == clean["report"]["train"]["rows"]
    assert sum(s["label_sum"] for s in shards) == pytest.approx(train["label"].sum())
    assert sum(s["first_feature_sum"] for s in shards) == pytest.approx(train["price_log"].sum())
    assert shards[0]["first_feature_sum"] != pytest.approx(shards[1]["first_feature_sum"])
    assert clean["report"]["matrix"]["kind"] == "in_memory"

    # the same trainer with its last worker killed at round 5 (a test trainer: the
    # reference one carries no fault injection)
    faulty_version = publish_trainer_archive(
        faulty_trainer(tmp_path / "faulty", fail_at_round=5),
        model_name="listing_ctr_model",
        base=file_base,
    ).version
    faulty = run(
        ray_two_nodes,
        file_base,
        faulty_version,
        f"{file_base}/runs/faulty",
        module="trainer.faulty_train",
    )
    fdist = faulty["report"]["distributed"]
    # the killed worker's group was restarted and resumed from the last checkpoint
    assert 1 <= fdist["resumed_from_round"] <= 5, fdist
    assert len(fdist["worker_starts"]) >= 4  # 2 workers x (first attempt + retry)
    assert faulty["md"]["holdout/auc"] == pytest.approx(clean["md"]["holdout/auc"], abs=TOLERANCE)
    assert faulty["md"]["holdout/logloss"] == pytest.approx(
        clean["md"]["holdout/logloss"], abs=TOLERANCE
    )
    assert faulty["report"]["num_rounds"] == ROUNDS
