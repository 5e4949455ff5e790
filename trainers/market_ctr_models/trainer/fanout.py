"""Train many small models: the workers start and warm up while the driver loads the
data, segments are batched into tasks (a few per CPU, not one task per model) and each
task's batch goes into Ray's object store once, in-flight tasks are bounded, a task whose
worker dies is retried, and results are collected as they finish. A segment that fails
is reported with its error, never silently dropped.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Iterable
from typing import Any


def train_segment(seg: str, arrays: dict[str, Any], conf: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import xgboost as xgb

    x, y, ds = arrays["x"], arrays["y"], arrays["ds"]
    hold = np.isin(ds, conf["holdout_days"])
    xtr, ytr, xho, yho = x[~hold], y[~hold], x[hold], y[hold]
    if len(ytr) == 0:
        raise ValueError(f"empty split: the training set of segment {seg} is empty")
    params = {
        "objective": "binary:logistic",
        "max_depth": conf["max_depth"],
        "nthread": 1,
        "seed": 0,
        "base_score": 0.5 if len(set(ytr.tolist())) < 2 else float(ytr.mean()),
    }
    booster = xgb.train(params, xgb.DMatrix(xtr, label=ytr), num_boost_round=conf["num_rounds"])
    metrics: dict[str, Any] = {"train_rows": len(ytr), "holdout_rows": len(yho)}
    status = {}
    if len(yho) == 0:
        status["holdout.auc"] = "empty split: the holdout set has no rows"
    else:
        p = booster.predict(xgb.DMatrix(xho))
        metrics["holdout_logloss"] = log_loss(yho, p)
        if len(set(yho.tolist())) < 2:
            status["holdout.auc"] = f"holdout has one class (every label is {int(yho[0])})"
        else:
            metrics["holdout_auc"] = roc_auc(yho, p)
    return {
        "segment": seg,
        "metrics": metrics,
        "status": status,
        "model": bytes(booster.save_raw(raw_format="ubj")),
    }


def log_loss(y: Any, p: Any) -> float:
    import numpy as np

    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def roc_auc(y: Any, p: Any) -> float:
    """Mann-Whitney AUC with tied scores averaged (numpy only: no sklearn import per worker)."""
    import numpy as np

    order = np.argsort(p, kind="mergesort")
    sorted_p = p[order]
    ranks = np.empty(len(p), dtype="float64")
    # average rank per run of tied scores
    _, first, counts = np.unique(sorted_p, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train_batch(
    segments: list[str], data: dict[str, dict[str, Any]], conf: dict[str, Any]
) -> list[dict[str, Any]]:
    """Train every segment of the batch; a failing segment is reported, the rest go on."""
    out = []
    for seg in segments:
        try:
            out.append(train_segment(seg, data[seg], conf))
        except Exception as exc:
            out.append({"segment": seg, "error": f"{type(exc).__name__}: {exc}"})
    return out


def warm_worker() -> int:
    """Import and exercise what every task needs, so the first batch starts at full speed."""
    import os

    import numpy as np
    import xgboost as xgb

    x = np.arange(8, dtype="float64").reshape(4, 2)
    xgb.train({"nthread": 1, "max_depth": 1}, xgb.DMatrix(x, label=[0, 1, 0, 1]), 1)
    return os.getpid()


def start_workers(num_workers: int = 0) -> list[Any]:
    """Start and warm one worker per CPU now (call before loading the data: the workers
    start and import while the driver reads). Returns the warm-up tasks' refs."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    cpus = num_workers or max(1, int(ray.available_resources().get("CPU", 1)))
    warm = ray.remote(num_cpus=1)(warm_worker)
    return [warm.remote() for _ in range(cpus)]


def batches(segments: list[str], size: int) -> list[list[str]]:
    return [segments[i : i + size] for i in range(0, len(segments), size)]


def run_serial(data: dict[str, dict[str, Any]], conf: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield from train_batch(sorted(data), data, conf)


def run_ray(
    data: dict[str, dict[str, Any]],
    conf: dict[str, Any],
    *,
    batch_size: int = 0,
    max_in_flight: int = 0,
    num_workers: int = 0,
    task_retries: int = 2,
    warming: list[Any] | None = None,
    log: Callable[[str], None] = print,
) -> Iterable[dict[str, Any]]:
    """Train every segment on Ray tasks, results as they finish.

    ``warming``: the refs of ``start_workers``' warm-up tasks. Until every worker is
    warm, the driver trains batches itself, and tasks go only to workers that are up,
    so a cold start is never slower than the serial loop; once all are up the driver
    only collects.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    cpus = num_workers or max(1, int(ray.available_resources().get("CPU", 1)))
    segments = sorted(data)
    # Small batches (about 16 per CPU, at most 100 segments): the driver takes one at a
    # time while workers start, and the last ones balance across workers.
    size = batch_size or max(1, min(100, math.ceil(len(segments) / (cpus * 16))))
    remote = ray.remote(num_cpus=1, max_retries=task_retries)(train_batch)
    pending = collections.deque(batches(segments, size))
    running: dict[Any, list[str]] = {}
    warm = list(warming or [])
    workers_up = 0 if warm else cpus
    done = by_driver = next_log = 0
    t0 = time.monotonic()
    while pending or running:
        if warm:
            up, warm = ray.wait(warm, num_returns=len(warm), timeout=0)
            workers_up += len(up)
        cap = max_in_flight or 2 * workers_up  # feed only the workers that are up
        while pending and len(running) < cap:
            batch = pending.popleft()
            # each task gets only its batch's arrays (one object each, not the whole table)
            part = ray.put({seg: data[seg] for seg in batch})
            running[remote.remote(batch, part, conf)] = batch
        driver_helps = bool(pending) and workers_up < cpus
        finished: list[Any] = []
        if running:
            finished, _ = ray.wait(
                list(running), num_returns=1, timeout=0 if driver_helps else None
            )
        for ref in finished:
            batch = running.pop(ref)
            try:
                results = ray.get(ref)
            except Exception as exc:  # retries exhausted: report every segment of the batch
                results = [
                    {"segment": s, "error": f"task failed after {task_retries} retries: {exc}"}
                    for s in batch
                ]
            done += len(results)
            yield from results
        if driver_helps:  # workers still starting: train a batch here meanwhile
            results = train_batch(pending.popleft(), data, conf)
            done += len(results)
            by_driver += len(results)
            yield from results
        if (finished or driver_helps) and (done == len(segments) or done >= next_log):
            next_log = done + max(1, len(segments) // 10)
            log(
                f"fan-out: {done}/{len(segments)} segments done in "
                f"{time.monotonic() - t0:.1f}s ({by_driver} by the driver, {workers_up} workers up)"
            )
