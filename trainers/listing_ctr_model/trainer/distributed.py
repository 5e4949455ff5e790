"""Distributed training with Ray Train V2 (``XGBoostTrainer`` with a training function).

* The training days reach the workers as a Ray Dataset (``datasets={"train": ...}``):
  each worker reads only its shard (``ray.train.get_dataset_shard``), once, into a
  node-local spool, and builds its matrix from it batch by batch (in memory, or external
  when the memory budget says so), inside xgboost's collective. Nothing passes data
  through ``train_loop_config``.
* The dataset is split without dropping rows (``WholeSplit``): the workers' shards add
  up to the training days.
* Checkpoints live under ``--checkpoint-dir`` (the platform passes the partition's
  ``_checkpoints``, beside its attempt folders) ``/{run name}``; the run name is keyed by
  a fingerprint of the training data, so a restarted job on the same data resumes from
  the last checkpoint and changed data starts afresh.
* ``FailureConfig`` retries after a worker dies; every worker reports every round
  (``RayTrainReportCallback(frequency=1)``); rank 0 alone keeps checkpoints, and the
  driver alone writes the final artifacts.
* Each worker records its rank, node, host, the round it resumed from and what it read
  (rows, the label's sum, the first feature's sum), so the report carries placement
  evidence: the shards differ and add up to the window.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from typing import Any

from zipline_runtime import trainer_io as tio


def _spool_shard(label: str, columns: list[str]) -> tuple[Any, dict[str, Any]]:
    """This worker's shard of ``train``, read once into a node-local spool; what it read."""
    import numpy as np
    import ray.train

    spool = tio.Spool()
    label_sum = first_sum = 0.0
    shard = ray.train.get_dataset_shard("train")
    for table in shard.iter_batches(batch_format="pyarrow", batch_size=None):
        for batch in table.select([*columns, label]).to_batches():
            spool.write(batch)
            label_sum += float(np.sum(batch.column(label).to_numpy(zero_copy_only=False)))
            first_sum += float(
                np.nansum(batch.column(columns[0]).to_numpy(zero_copy_only=False), dtype=float)
            )
    spool.close()
    read = {"rows": spool.rows, "label_sum": label_sum, "first_feature_sum": first_sum}
    return spool, read


def _train_fn(config: dict[str, Any]) -> None:
    import numpy as np
    import ray.train
    import xgboost as xgb
    from ray.train.xgboost import RayTrainReportCallback

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    label, columns = config["label"], config["columns"]
    spool, read = _spool_shard(label, columns)

    def source() -> Any:
        if not spool.rows:  # a shard without rows still takes part in the collective
            yield np.empty((0, len(columns)), dtype=np.float32), np.empty(0)
        for b in spool.batches():
            y = b.column(label).to_numpy(zero_copy_only=False).astype(np.float64)
            yield tio.as_matrix(b, columns), y

    plan = tio.MatrixPlan.for_rows(spool.rows, len(columns), config["memory_budget"])
    dtrain, cache = tio.build_matrix(
        xgb, source, plan, feature_names=config["features"], nthread=config["params"]["nthread"]
    )
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
        "read": read,
        "matrix": plan.to_json(),
    }
    tio.write_bytes(
        config["attempts_dir"], f"rank{rank}-{time.time_ns()}.json", json.dumps(info).encode()
    )
    callbacks: list[Any] = [RayTrainReportCallback(frequency=1)]
    try:
        xgb.train(
            config["params"],
            dtrain,
            num_boost_round=config["num_rounds"] - done,
            xgb_model=start_model,
            callbacks=callbacks,
        )
    finally:
        spool.remove()
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def _whole_split() -> Any:
    """A ``DataConfig`` that splits ``train`` across the workers without dropping rows
    (Ray Train's default evens the shards, dropping up to a row per worker), in a
    fixed order; the other datasets as Ray Train does."""
    from ray.train import DataConfig

    class WholeSplit(DataConfig):  # type: ignore[misc]
        def configure(
            self, datasets: dict[str, Any], world_size: int, worker_handles: Any,
            worker_node_ids: Any, **kwargs: Any,
        ) -> list[dict[str, Any]]:  # fmt: skip
            out: list[dict[str, Any]] = [{} for _ in range(world_size)]
            for name, ds in datasets.items():
                ds = ds.copy(ds)
                ds.context.execution_options = self._resolve_execution_options(name)
                ds.context.execution_options.preserve_order = True
                for i, split in enumerate(ds.streaming_split(world_size, equal=False)):
                    out[i][name] = split
            return out

    return WholeSplit()


def train_distributed(
    *,
    dataset: Any,
    label: str,
    features: list[str],
    columns: list[str],
    params: dict[str, Any],
    num_rounds: int,
    num_workers: int,
    memory_budget: int | None,
    checkpoint_dir: str,
    data_fingerprint: str,
    max_failures: int = 2,
) -> tuple[Any, dict[str, Any]]:
    import ray
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=True)
    # the job's log is the trainer's: no progress bars redrawn into it
    ray.data.DataContext.get_current().enable_progress_bars = False
    name = f"train-{data_fingerprint}"
    storage = checkpoint_dir
    attempts_dir = tio.join(storage, name, "workers")
    # Checkpoints go through the platform's storage layer (the same endpoints and
    # credentials as every other read and write), handed to Ray Train as a pyarrow fs.
    storage_fs, storage_path = tio.arrow_filesystem(storage)
    per_worker: dict[str, float] = {"CPU": 1}
    if memory_budget:
        per_worker["memory"] = memory_budget
    trainer = XGBoostTrainer(
        _train_fn,
        train_loop_config={
            "label": label,
            "columns": columns,
            "features": features,
            "params": params,
            "num_rounds": num_rounds,
            "memory_budget": memory_budget,
            "attempts_dir": attempts_dir,
        },
        datasets={"train": dataset},
        dataset_config=_whole_split(),
        scaling_config=ScalingConfig(
            num_workers=num_workers, resources_per_worker=per_worker, placement_strategy="SPREAD"
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
    last = {r["rank"]: r for r in records}  # each rank's last attempt: what trained
    info = {
        "world_size": num_workers,
        "checkpoint_dir": tio.join(storage, name),
        "worker_starts": records,
        "nodes": sorted({r["node_id"] for r in records}),
        "attempts": len({round(r["started_at"]) for r in records if r["rank"] == 0}),
        "resumed_from_round": max(resumed) if resumed else 0,
        "seconds": round(time.monotonic() - t0, 3),
        "shards": [last[k]["read"] for k in sorted(last)],
        "matrix": last[min(last)]["matrix"] if last else None,
    }
    return booster, info
