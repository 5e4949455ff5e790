"""Train many small models: a pool of Ray actors starts and warms up while the driver
loads the data, segments are batched (a few batches per slot, not one call per model),
each batch goes into Ray's object store once, batches in flight per worker are bounded,
a batch whose worker dies is retried, and results are collected as they finish. The
driver is one of the training slots: it trains a batch whenever no result is waiting, so
a worker still starting costs nothing but its start-up. A segment that fails is reported
with its error, never silently dropped.
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
    # One thread everywhere, DMatrix included: a DMatrix left at its default uses every
    # core, and its OpenMP threads spin on the cores the other trainers are using.
    dtrain = xgb.DMatrix(xtr, label=ytr, nthread=1)
    booster = xgb.train(params, dtrain, num_boost_round=conf["num_rounds"])
    metrics: dict[str, Any] = {"train_rows": len(ytr), "holdout_rows": len(yho)}
    status = {}
    if len(yho) == 0:
        status["holdout.auc"] = "empty split: the holdout set has no rows"
    else:
        p = booster.predict(xgb.DMatrix(xho, nthread=1))
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
    """Train every segment of the batch; a failing segment is reported, the rest go on.
    Each result names the process that trained it (``pid``)."""
    import os

    out = []
    for seg in segments:
        try:
            out.append(train_segment(seg, data[seg], conf))
        except Exception as exc:
            out.append({"segment": seg, "error": f"{type(exc).__name__}: {exc}"})
        out[-1]["pid"] = os.getpid()
    return out


def warm_worker() -> int:
    """Import and exercise what every task needs, so the first batch starts at full speed."""
    import os

    import numpy as np
    import xgboost as xgb

    x = np.arange(8, dtype="float64").reshape(4, 2)
    xgb.train({"nthread": 1, "max_depth": 1}, xgb.DMatrix(x, label=[0, 1, 0, 1], nthread=1), 1)
    return os.getpid()


class SegmentTrainer:
    """One training process of the pool: warm (imports done) once built, then trains the
    batches sent to it one after another."""

    def __init__(self) -> None:
        self.pid = warm_worker()

    def ready(self) -> int:
        return self.pid

    def train(
        self, segments: list[str], data: dict[str, dict[str, Any]], conf: dict[str, Any]
    ) -> list[dict[str, Any]]:
        return train_batch(segments, data, conf)


def cluster_cpus() -> int:
    """CPUs free on the cluster now (connecting to it first)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    return max(1, int(ray.available_resources().get("CPU", 1)))


def start_workers(slots: int = 0, task_retries: int = 2) -> list[Any]:
    """Start the pool's workers now (call before loading the data: they start and import
    while the driver reads). The driver trains too, so it is one of the ``slots`` (0: the
    cluster's free CPUs) and ``slots - 1`` workers start, each a Ray actor holding one CPU,
    so exactly that many processes train (tasks would let Ray start one more process per
    free CPU for a queued task). A worker that dies is restarted and its batch retried,
    up to ``task_retries`` times. Returns the workers."""
    import ray

    workers = (slots or cluster_cpus()) - 1
    cls = ray.remote(num_cpus=1, max_restarts=task_retries, max_task_retries=task_retries)(
        SegmentTrainer
    )
    return [cls.remote() for _ in range(workers)]


def batches(segments: list[str], size: int) -> list[list[str]]:
    return [segments[i : i + size] for i in range(0, len(segments), size)]


def run_serial(data: dict[str, dict[str, Any]], conf: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield from train_batch(sorted(data), data, conf)


def run_ray(
    data: dict[str, dict[str, Any]],
    conf: dict[str, Any],
    *,
    workers: list[Any],
    batch_size: int = 0,
    max_in_flight: int = 2,
    task_retries: int = 2,
    log: Callable[[str], None] = print,
) -> Iterable[dict[str, Any]]:
    """Train every segment on the driver and on the pool's workers, results as they finish.

    ``workers``: ``start_workers``' actors, perhaps still starting. Batches go only to
    workers that are up, at most ``max_in_flight`` each (two, so none waits for the driver
    between batches), and between collecting results the driver trains a batch itself:
    a cold worker costs nothing but its start-up, and with no worker the driver trains
    alone. A batch whose worker died past its retries is reported failed, segment by
    segment, and that worker gets no more batches.
    """
    import ray

    segments = sorted(data)
    # Small batches (about 16 per slot, at most 100 segments): the driver takes one at a
    # time between results, and the last ones balance across workers.
    size = batch_size or max(1, min(100, math.ceil(len(segments) / ((len(workers) + 1) * 16))))
    pending = collections.deque(batches(segments, size))
    starting = {w.ready.remote(): w for w in workers}
    up: list[Any] = []
    running: dict[Any, tuple[Any, list[str]]] = {}
    load: dict[Any, int] = {}
    done = by_driver = next_log = 0
    t0 = time.monotonic()
    while pending or running:
        if starting:
            ready, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0)
            for ref in ready:
                worker = starting.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:  # could not start: the others and the driver go on
                    log(f"fan-out: a worker failed to start and is left out: {exc}")
                    continue
                up.append(worker)
                load[worker] = 0
        for worker in up:  # feed only the workers that are up
            while pending and load[worker] < max_in_flight:
                batch = pending.popleft()
                # each call gets only its batch's arrays (one object, not the whole table)
                part = ray.put({seg: data[seg] for seg in batch})
                running[worker.train.remote(batch, part, conf)] = (worker, batch)
                load[worker] += 1
        finished: list[Any] = []
        if running:  # wait only when the driver has nothing left to train
            finished, _ = ray.wait(list(running), num_returns=1, timeout=0 if pending else None)
        for ref in finished:
            worker, batch = running.pop(ref)
            load[worker] -= 1
            try:
                results = ray.get(ref)
            except Exception as exc:  # retries exhausted: report every segment of the batch
                results = [
                    {"segment": s, "error": f"task failed after {task_retries} retries: {exc}"}
                    for s in batch
                ]
                if worker in up:
                    up.remove(worker)
            done += len(results)
            yield from results
        trained_here = bool(pending)
        if trained_here:
            results = train_batch(pending.popleft(), data, conf)
            done += len(results)
            by_driver += len(results)
            yield from results
        if (finished or trained_here) and (done == len(segments) or done >= next_log):
            next_log = done + max(1, len(segments) // 10)
            log(
                f"fan-out: {done}/{len(segments)} segments done in {time.monotonic() - t0:.1f}s "
                f"({by_driver} by the driver, {len(up)} of {len(workers)} workers up)"
            )
