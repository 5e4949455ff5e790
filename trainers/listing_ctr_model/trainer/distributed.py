"""Distributed training with Ray Train V2 (``XGBoostTrainer`` with a training function).

* Each worker trains on its shard (rows ``rank::world_size``) inside xgboost's collective.
* Checkpoints live under ``--checkpoint-dir`` (the platform passes the partition's
  ``_checkpoints``, beside its attempt folders) ``/{run name}``; the run name is keyed by
  a fingerprint of the training data, so a restarted job on the same data resumes from
  the last checkpoint and changed data starts afresh.
* ``FailureConfig`` retries after a worker dies; every worker reports every round
  (``RayTrainReportCallback(frequency=1)``); rank 0 alone keeps checkpoints, and the
  driver alone writes the final artifacts.
* Each worker records its rank, node, host and the round it resumed from, so the report
  carries placement evidence.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from zipline_runtime import trainer_io as tio


def _train_fn(config: dict[str, Any]) -> None:
    import ray.train
    import xgboost as xgb
    from ray.train.xgboost import RayTrainReportCallback

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y = config["x"][rank::world], config["y"][rank::world]
    dtrain = xgb.DMatrix(x, label=y, feature_names=config["features"])
    start_model = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        start_model = RayTrainReportCallback.get_model(checkpoint)
    done = start_model.num_boosted_rounds() if start_model is not None else 0
    info = {
        "rank": rank,
        "world_size": world,
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "resumed_from_round": done,
        "started_at": time.time(),
    }
    tio.write_bytes(
        config["attempts_dir"], f"rank{rank}-{time.time_ns()}.json", json.dumps(info).encode()
    )

    callbacks: list[Any] = [RayTrainReportCallback(frequency=1)]
    xgb.train(
        config["params"],
        dtrain,
        num_boost_round=config["num_rounds"] - done,
        xgb_model=start_model,
        callbacks=callbacks,
    )


def train_distributed(
    *,
    x: Any,
    y: Any,
    features: list[str],
    params: dict[str, Any],
    num_rounds: int,
    num_workers: int,
    checkpoint_dir: str,
    data_fingerprint: str,
    max_failures: int = 2,
) -> tuple[Any, dict[str, Any]]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=True)
    name = f"train-{data_fingerprint}"
    storage = checkpoint_dir
    attempts_dir = tio.join(storage, name, "workers")
    # Checkpoints go through the platform's storage layer (the same endpoints and
    # credentials as every other read and write), handed to Ray Train as a pyarrow fs.
    storage_fs, storage_path = tio.arrow_filesystem(storage)
    trainer = XGBoostTrainer(
        _train_fn,
        train_loop_config={
            "x": x,
            "y": y,
            "features": features,
            "params": params,
            "num_rounds": num_rounds,
            "attempts_dir": attempts_dir,
        },
        scaling_config=ScalingConfig(
            num_workers=num_workers, resources_per_worker={"CPU": 1}, placement_strategy="SPREAD"
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    t0 = time.monotonic()
    result = trainer.fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    fs, path = tio.filesystem(attempts_dir)
    records = [json.loads(fs.cat_file(p)) for p in sorted(fs.find(path))]
    records.sort(key=lambda r: r["started_at"])
    resumed = [r["resumed_from_round"] for r in records if r["resumed_from_round"] > 0]
    info = {
        "world_size": num_workers,
        "checkpoint_dir": tio.join(storage, name),
        "worker_starts": records,
        "nodes": sorted({r["node_id"] for r in records}),
        "attempts": len({round(r["started_at"]) for r in records if r["rank"] == 0}),
        "resumed_from_round": max(resumed) if resumed else 0,
        "seconds": round(time.monotonic() - t0, 3),
    }
    return booster, info
