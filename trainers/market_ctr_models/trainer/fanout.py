"""Train many small models: the driver trains, and a pool of Ray actors joins it when the
work outlasts a worker's start (connecting to Ray and starting the workers happen in a
background thread, so the driver never waits for them; they warm up while it trains).
Segments are batched (a few batches per slot, not one call per model, smaller towards
the end so every slot finishes together), each batch goes into Ray's object store once,
batches in flight per worker are bounded, a batch whose worker dies is retried, and
results are collected as they finish. Work too short for a worker's start is trained by
the driver alone, on threads (xgboost's native code releases the GIL). A segment that
fails is reported with its error, never silently dropped.
"""

from __future__ import annotations

import collections
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from zipline_runtime import trainer_io as tio


def train_segment(seg: str, arrays: dict[str, Any], conf: dict[str, Any]) -> dict[str, Any]:
    xgb = tio.import_xgboost()

    x, y, hold = arrays["x"], arrays["y"], arrays["hold"]
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
        metrics["holdout_logloss"] = tio.log_loss(yho, p)
        if len(set(yho.tolist())) < 2:
            status["holdout.auc"] = f"holdout has one class (every label is {int(yho[0])})"
        else:
            metrics["holdout_auc"] = tio.roc_auc(yho, p)
    return {
        "segment": seg,
        "metrics": metrics,
        "status": status,
        "model": bytes(booster.save_raw(raw_format="ubj")),
    }


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

    xgb = tio.import_xgboost()
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
    """Whole CPUs free on the cluster now (connecting to it first)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    return int(ray.available_resources().get("CPU", 0))


def driver_cpus() -> int:
    """The CPUs Ray reserved for this job's driver: Ray passes them to the entrypoint as
    ``OMP_NUM_THREADS`` (whole CPUs, at least 1); 0 when it is not set (the trainer run by
    hand holds none of the cluster's CPUs). At most the CPUs this process may run on."""
    import os

    omp = os.environ.get("OMP_NUM_THREADS", "")
    return min(int(omp), local_cpus()) if omp.isdigit() else 0


def auto_slots() -> int:
    """The pool's slots when the model does not say (``--num-workers=0``): the driver and
    a worker per CPU free on the cluster. A job's driver trains on the CPUs Ray reserved
    for it, which are not free (counting the driver as one of the free ones would leave a
    2-CPU cluster's second CPU idle); a driver run by hand holds none, and takes one."""
    return 1 + max(0, cluster_cpus() - (0 if driver_cpus() else 1))


def start_workers(slots: int = 0, task_retries: int = 2) -> list[Any]:
    """Start the pool's workers now. The driver trains too, so it is one of the ``slots``
    (0: ``auto_slots``) and ``slots - 1`` workers start, each a Ray actor holding one CPU,
    so exactly that many processes train (tasks would let Ray start one more process per
    free CPU for a queued task). A worker that dies is restarted and its batch retried, up
    to ``task_retries`` times. Returns the workers (perhaps still starting; none when the
    driver is the only slot)."""
    import ray

    workers = (slots or auto_slots()) - 1
    cls = ray.remote(num_cpus=1, max_restarts=task_retries, max_task_retries=task_retries)(
        SegmentTrainer
    )
    return [cls.remote() for _ in range(workers)]


class _NoMainThreadWarning:
    """Drops Ray's warning that ``ray.init`` outside the main thread sets no SIGTERM
    handler: ``PoolStart`` sets Ray's handler on the main thread itself."""

    def filter(self, record: Any) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


#: However small, an xgboost model costs at least about a millisecond to train (its
#: DMatrix and booster): a lower bound of the driver's work before it has timed any.
MIN_SECONDS_PER_SEGMENT = 0.001


def pool_wanted(segments: int, min_pool_seconds: float) -> bool:
    """Whether the segment count alone says the work outlasts ``min_pool_seconds``."""
    return segments * MIN_SECONDS_PER_SEGMENT > min_pool_seconds


class PoolStart:
    """The pool's start, in a background thread once ``start()`` is called: importing
    Ray, connecting to the cluster and asking for the workers take about a second, which
    the driver spends training instead. Until then (and with ``skip()``) nothing of Ray is
    imported, so a job too small for workers runs exactly as the serial loop."""

    def __init__(self, slots: int = 0, task_retries: int = 2) -> None:
        self.slots, self.task_retries = slots, task_retries
        self.workers: list[Any] | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the pool in the background (once; later calls do nothing)."""
        import logging

        if self._thread is not None:
            return
        ray = sys.modules.get("ray")
        connected = ray is not None and ray.is_initialized()  # e.g. inside a Ray task
        if not connected and threading.current_thread() is threading.main_thread():
            # Ray's own driver handler (exit on SIGTERM, so a stopped job unwinds), which
            # ray.init sets only when called from the main thread.
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
            logging.getLogger("ray._private.worker").addFilter(_NoMainThreadWarning())
        # a daemon: a cluster that does not answer (ray.init retries for as long as it
        # takes) must never keep the trainer's process from ending once it is done
        self._thread = threading.Thread(target=self._start, name="fan-out pool start", daemon=True)
        self._thread.start()

    def skip(self) -> None:
        self.workers = []

    def _start(self) -> None:
        try:
            self.workers = start_workers(self.slots, self.task_retries)
        except BaseException as exc:  # raised on the driver by poll()
            self.error = exc

    def poll(self, wait: float = 0.0) -> list[Any] | None:
        """The workers once they have been asked for (None until then, after waiting up to
        ``wait`` seconds for the start); raises what stopped the start."""
        if self._thread is None:
            return self.workers
        if wait:
            self._thread.join(wait)
        if self._thread.is_alive():
            return None
        if self.error is not None:
            raise RuntimeError(f"could not start the Ray worker pool: {self.error}") from self.error
        return self.workers or []


def run_serial(data: dict[str, dict[str, Any]], conf: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield from train_batch(sorted(data), data, conf)


def local_cpus() -> int:
    """CPUs this process may run on."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: How long the driver, done with every segment, waits for a pool start still under way
#: (connecting to a healthy cluster takes about a second; one that does not answer, forever).
POOL_START_WAIT_AT_END = 10.0


#: Threads share the GIL over the Python between xgboost's native calls (a large part of
#: a small model's time), which bounds what they can use: more than this buy nothing.
MAX_AUTO_THREADS = 4


def driver_threads(threads: int, slots: int) -> int:
    """The driver's training threads when it trains alone: ``threads`` if given; else the
    job's ``slots`` when given (the model's declared parallelism, the driver being one);
    else the CPUs Ray reserved for the job's driver (``driver_cpus``, 1 when none), so the
    driver uses no CPU the job did not ask for. Automatic counts are at most the CPUs this
    process may run on and ``MAX_AUTO_THREADS``."""
    if threads:
        return threads
    return max(1, min(slots or driver_cpus() or 1, local_cpus(), MAX_AUTO_THREADS))


def share_batch(segments: int, slots: int) -> int:
    """Automatic batch size: about 1/16 of a slot's share of ``segments``, at most 100."""
    return max(1, min(100, math.ceil(segments / (slots * 16))))


def train_threaded(
    segments: list[str],
    data: dict[str, dict[str, Any]],
    conf: dict[str, Any],
    threads: int,
    batch_size: int = 0,
) -> Iterable[dict[str, Any]]:
    """Train ``segments`` on ``threads`` threads of this process, results in segment order.
    xgboost trains, predicts and builds its matrices in native code with the GIL released
    (ctypes), so threads train side by side, each model on one core; what they share is
    the GIL over the Python between the native calls (about 1.6x on 2 threads for models
    of a few milliseconds)."""
    from concurrent.futures import ThreadPoolExecutor

    if threads <= 1 or len(segments) < 2:
        yield from train_batch(segments, data, conf)
        return
    size = batch_size or share_batch(len(segments), threads)
    batches = [segments[i : i + size] for i in range(0, len(segments), size)]
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fan-out driver")
    try:
        for results in pool.map(lambda batch: train_batch(batch, data, conf), batches):
            yield from results
    finally:  # stopped early (an error, a closed generator): drop the batches not begun
        pool.shutdown(wait=True, cancel_futures=True)


def run_ray(
    data: dict[str, dict[str, Any]],
    conf: dict[str, Any],
    *,
    pool: PoolStart,
    min_pool_seconds: float = 10.0,
    threads: int = 0,
    batch_size: int = 0,
    max_in_flight: int = 2,
    task_retries: int = 2,
    log: Callable[[str], None] = print,
    stats: dict[str, Any] | None = None,
) -> Iterable[dict[str, Any]]:
    """Train every segment on the driver and on the pool's workers, results as they finish.

    ``pool``: the workers, perhaps already starting (the caller starts them as soon as it
    knows the segment count, so they start while it prepares the data). They are worth
    their start-up (seconds, on a cold cluster) only for work that outlasts it: unless
    started, the driver asks for them when the segment count alone says the work takes
    longer than ``min_pool_seconds`` (``pool_wanted``), else when a first batch of 16,
    timed, says the rest does; otherwise it trains the rest alone, as the serial loop does.

    Batches are queued on a worker as soon as it is asked for (Ray runs them the moment it
    is up), at most ``max_in_flight`` each (two, so none waits for the driver between
    batches); each turn the driver collects every result that is ready, tops the workers
    up, then trains a batch itself. A worker still starting costs nothing but its
    start-up: once the driver has nothing else to train it takes back the batches queued
    on workers not yet up (a worker that cannot be placed would hold them forever), and
    a worker that fails to start is left out, its batches going back to the driver. A
    batch whose worker died past its retries is reported failed, segment by segment, and
    that worker gets no more batches. A pool that cannot start (Ray not reachable, say)
    leaves the driver to train the rest alone; one still starting when the driver has
    trained everything is waited for ``POOL_START_WAIT_AT_END`` at most. Either is said in
    the log and in ``stats["pool_error"]``, never a failed or hanging job.

    When it trains alone, the driver trains on ``threads`` threads (0: ``driver_threads``),
    xgboost releasing the GIL in its native code; beside workers, on ``threads`` (0: the
    CPUs Ray reserved for it, ``driver_threads`` without slots), each thread a slot of the
    batch sizing: a worker process being worth more than a thread once up, the driver
    asks for no more than it holds, but leaves none of it idle.

    ``stats`` (when given) gets ``first_up_seconds``: when the driver saw the first worker
    up, from the start of this call, and ``done_before_up``: the segments done by then
    (None, 0 if none came up); after that, the slots trained together; and
    ``driver_threads``: the threads the driver trained on.
    """
    stats = {} if stats is None else stats
    side = driver_threads(threads, 0)  # beside workers: the CPUs the driver holds
    stats.update(first_up_seconds=None, done_before_up=0, driver_threads=side, pool_error=None)
    segments = sorted(data)
    todo = collections.deque(segments)
    workers: list[Any] | None = None  # known once the pool's start is done

    def next_batch(n: int = 0) -> list[str]:
        # Auto size: a slot's share's batch, and at most a quarter of what is left per
        # slot, so that towards the end batches shrink and every slot finishes at about
        # the same time.
        if not n:
            slots = len(active) + side
            tail = math.ceil(len(todo) / (slots * 4))
            n = batch_size or min(share_batch(len(segments), slots), tail)
        return [todo.popleft() for _ in range(min(n, len(todo)))]

    def train_alone(why: str) -> Iterable[dict[str, Any]]:
        """The segments left, on the driver's threads: no worker will train any."""
        n = stats["driver_threads"] = driver_threads(threads, pool.slots)
        log(f"fan-out: {why}; it trains them on {n} thread{'s' * (n != 1)}")
        rest = list(todo)
        todo.clear()
        yield from train_threaded(rest, data, conf, n, batch_size)

    t0 = time.monotonic()
    first: list[dict[str, Any]] = []
    active: list[Any] = []  # workers asked for that get batches (not failed, not given up)
    if not pool.started:
        if pool_wanted(len(todo), min_pool_seconds):
            pool.start()  # worth it whatever a model costs: no need to time one first
        else:
            tio.import_xgboost()  # not part of the timing below
            timed = time.monotonic()
            first = train_batch(next_batch(16), data, conf)
            left = (time.monotonic() - timed) / max(1, len(first)) * len(todo)
            if left > min_pool_seconds:
                pool.start()
            else:
                pool.skip()
                yield from first
                yield from train_alone(
                    f"the driver alone needs about {left:.1f}s for the {len(todo)} segments "
                    f"left (--min-pool-seconds={min_pool_seconds:g}): no workers started"
                )
                return
            yield from first

    starting: dict[Any, Any] = {}  # a worker's ready() call -> the worker, until it answers
    up: set[Any] = set()
    running: dict[Any, tuple[Any, list[str]]] = {}
    load: dict[Any, int] = {}
    done = by_driver = len(first)
    next_log = 0

    def leave_out(worker: Any) -> None:
        """No more batches for ``worker``; those queued on it come back to the driver
        (cancelled on the worker if it has not begun them, their results ignored)."""
        import ray

        if worker in active:
            active.remove(worker)
        for ref, (w, batch) in list(running.items()):
            if w is worker:
                del running[ref]
                load[worker] -= 1
                todo.extend(batch)
                ray.cancel(ref)

    def check_starting(worker: Any = None) -> None:
        """Note the workers whose ready() answered; for ``worker``, wait for its answer
        (given once a call queued behind it has ended, so it is there or about to be)."""
        import ray

        for ref, w in list(starting.items()):
            if worker is not None and w is not worker:
                continue
            if worker is None and not ray.wait([ref], timeout=0)[0]:
                continue
            del starting[ref]
            try:
                ray.get(ref)
            except Exception as exc:  # could not start: the others and the driver go on
                log(f"fan-out: a worker failed to start and is left out: {exc}")
                leave_out(w)
                continue
            up.add(w)
            if stats["first_up_seconds"] is None:
                stats.update(first_up_seconds=time.monotonic() - t0, done_before_up=done)

    while todo or running:
        if workers is None:
            try:
                workers = pool.poll()  # no Ray call on the driver before its start is done
            except RuntimeError as exc:  # no workers: the driver trains the rest alone
                stats["pool_error"] = str(exc)
                yield from train_alone(f"{exc}; the driver has {len(todo)} segments left")
                break
            if workers == []:  # the driver is the pool's one slot
                why = (
                    f"--num-workers={pool.slots}"
                    if pool.slots
                    else "the cluster has no CPU free besides the driver's"
                )
                yield from train_alone(
                    f"one training slot ({why}): no workers started; the driver has "
                    f"{len(todo)} segments left"
                )
                break
            if workers is not None:
                starting = {w.ready.remote(): w for w in workers}
                active = list(workers)
                load = dict.fromkeys(workers, 0)
        finished: list[Any] = []
        if starting or running:
            import ray

            check_starting()
            if running and not todo:
                # Nothing left for the driver: batches queued on a worker not up yet come
                # back to it rather than wait for that worker's start, however long.
                for worker in {w for w, _ in running.values()} - up:
                    log("fan-out: a worker is still starting; the driver takes back its batches")
                    leave_out(worker)
            if running:  # every result that is ready; block (for one) only when the driver
                # has nothing left to train. Collecting one per turn would hold a worker
                # to the driver's pace, since the driver trains a batch between turns.
                finished, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
                if not finished and not todo:
                    finished, _ = ray.wait(list(running), num_returns=1)
            for ref in finished:
                if ref not in running:  # taken back by the driver meanwhile
                    continue
                worker, batch = running.pop(ref)
                load[worker] -= 1
                try:
                    results = ray.get(ref)
                except Exception as exc:
                    check_starting(worker)
                    if worker not in up:  # it never started: none of its batches ran
                        leave_out(worker)
                        todo.extend(batch)
                        continue
                    # retries exhausted: report every segment of the batch
                    results = [
                        {"segment": s, "error": f"task failed after {task_retries} retries: {exc}"}
                        for s in batch
                    ]
                    if worker in active:
                        active.remove(worker)
                done += len(results)
                yield from results
            # Top the workers up after collecting and before the driver trains: each then
            # has a batch queued for the whole of the driver's.
            for worker in active:
                while todo and load[worker] < max_in_flight:
                    batch = next_batch()
                    # each call gets only its batch's arrays (one object, not the whole table)
                    part = ray.put({seg: data[seg] for seg in batch})
                    running[worker.train.remote(batch, part, conf)] = (worker, batch)
                    load[worker] += 1
        trained_here = bool(todo)
        if trained_here:  # a batch per thread, on the driver's threads side by side
            mine = [seg for _ in range(side) for seg in next_batch()]
            results = list(train_threaded(mine, data, conf, side, math.ceil(len(mine) / side)))
            done += len(results)
            by_driver += len(results)
            yield from results
        if (finished or trained_here) and (done == len(segments) or done >= next_log):
            next_log = done + max(1, len(segments) // 10)
            log(
                f"fan-out: {done}/{len(segments)} segments done in {time.monotonic() - t0:.1f}s "
                f"({by_driver} by the driver, {len(up)} of "
                f"{'?' if workers is None else len(workers)} workers up)"
            )
    try:  # a start still under way when the driver has trained everything
        if stats["pool_error"] is None and pool.poll(wait=POOL_START_WAIT_AT_END) is None:
            stats["pool_error"] = (
                f"the Ray worker pool was still starting {POOL_START_WAIT_AT_END:g}s after "
                "the driver had trained every segment (does the cluster at RAY_ADDRESS "
                "answer?); the run ends without it"
            )
            log(f"fan-out: {stats['pool_error']}")
    except RuntimeError as exc:  # it failed: nothing was waiting for it
        stats["pool_error"] = str(exc)
        log(f"fan-out: {exc}; the driver had trained every segment")
