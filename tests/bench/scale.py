"""Data at scale, the bench's half: a synthetic training table written straight into
Iceberg, the three ways of training its window (xgboost by hand, the model partition
in-process, on 2 Ray Train workers) and a scored day, each run as its own process tree
whose resident memory is sampled from ``/proc`` (the largest process, every process
summed, each Ray Train worker). Results go to ``results/scaling.json``; the report
renders them (``tests.bench.report``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.ray_share import descendants

SCALING = Path(__file__).resolve().parent / "results" / "scaling.json"
DAYS = ["2026-07-07", "2026-07-08", "2026-07-09", "2026-07-10"]
FEATURES = [f"x{i}" for i in range(8)]
ROUNDS = 20
#: the bytes of one row of the window as a float64 frame: 8 features and the label
FRAME_ROW_BYTES = (len(FEATURES) + 1) * 8

#: xgboost by hand: the window read with pyiceberg at its snapshot (a pyarrow table),
#: the training days into a QuantileDMatrix, the same parameters and threads, the
#: holdout predicted: the limit the trainer is measured against
BY_HAND = f"""
import sys, time
import numpy as np
import pyarrow.compute as pc
from zipline_runtime.stats import import_xgboost
from pyiceberg.table import StaticTable
from zipline_runtime.tables import iceberg_io_properties, newest_metadata
xgb = import_xgboost()
warehouse, table, hold = sys.argv[1], sys.argv[2], sys.argv[3]
t = StaticTable.from_metadata(newest_metadata(warehouse, table), properties=iceberg_io_properties())
data = t.scan().to_arrow()
train = data.filter(pc.not_equal(data["ds"], hold))
x = np.column_stack([train[c].to_numpy().astype(np.float32) for c in {FEATURES}])
m = xgb.QuantileDMatrix(x, label=train["label"].to_numpy(), nthread=2)
del x, train
b = xgb.train({{"objective": "binary:logistic", "max_depth": 4, "eta": 0.3, "nthread": 2,
               "tree_method": "hist"}}, m, num_boost_round={ROUNDS})
ho = data.filter(pc.equal(data["ds"], hold))
b.inplace_predict(np.column_stack([ho[c].to_numpy().astype(np.float32) for c in {FEATURES}]))
"""

#: booster.predict by hand over the scored day's files, each file's scores written beside
PREDICT_BY_HAND = f"""
import sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from zipline_runtime.stats import import_xgboost
xgb = import_xgboost()
b = xgb.Booster(); b.load_model(sys.argv[1])
for n, path in enumerate(sys.argv[3:]):
    t = pq.read_table(path, columns={FEATURES})
    x = np.column_stack([t[c].to_numpy().astype(np.float32) for c in {FEATURES}])
    score = b.inplace_predict(x).astype(np.float64)
    pq.write_table(pa.table({{"score": score}}), f"{{sys.argv[2]}}/part-{{n}}.parquet")
"""


def write_window(warehouse: str, table: str, rows: int, days: list[str] = DAYS) -> None:
    """``rows`` rows over ``days`` into Iceberg table ``table`` (one commit a day): 8
    float features of 2 decimals (as a feature store rounds them) and a label two of
    them drive, written a million rows at a time."""
    import numpy as np
    import pandas as pd

    from tests.helpers import tables_of

    tables = tables_of(warehouse)
    per_day = rows // len(days)
    for n, ds in enumerate(days):
        rng = np.random.default_rng(n)
        cols = {c: np.round(rng.normal(size=per_day), 2) for c in FEATURES}
        logit = cols["x0"] - 0.7 * cols["x1"] + 0.3 * cols["x2"] * cols["x3"]
        cols["label"] = (rng.random(per_day) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        tables.write_frame(table, ds, pd.DataFrame(cols))
        del cols


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return 0


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            out[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Peaks:
    """Peak resident memory (MB), sampled 10 times a second over the process trees of
    ``roots`` (the first: the run's own): each process's peak, the peak of every
    process summed, and which processes were the run's own or Ray Train workers."""

    roots: list[int]
    per_pid: dict[int, float] = field(default_factory=dict)
    own: set[int] = field(default_factory=set)
    workers: set[int] = field(default_factory=set)
    total_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        while not self._stop.is_set():
            parents = _parents()
            self.own.update(descendants(self.roots[0], parents))
            pids = {p for r in self.roots for p in descendants(r, parents)}
            rss = {p: _rss_kb(p) / 1024 for p in pids}
            self.total_mb = max(self.total_mb, sum(rss.values()))
            for p, mb in rss.items():
                self.per_pid[p] = max(self.per_pid.get(p, 0.0), mb)
                if p not in self.own and "RayTrainWorker" in _command(p):
                    self.workers.add(p)
            time.sleep(0.1)

    def __enter__(self) -> Peaks:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Run:
    wall_s: float
    #: the largest of the run's own processes and its Ray Train workers
    largest_mb: float
    #: every sampled process summed (with a Ray head: its processes too)
    total_mb: float
    #: the largest Ray Train worker's peak (None: no workers)
    worker_mb: float | None


def measure(argv: list[str], *, cwd: Path, env: dict[str, str], also: tuple[int, ...] = ()) -> Run:
    """Run ``argv`` to its end, its process tree (and ``also``'s: a Ray head's) sampled;
    fails with its output when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with Peaks([proc.pid, *also]) as peaks:
        out, _ = proc.communicate(timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise AssertionError(f"{argv[:4]} failed ({proc.returncode}):\n{out[-4000:]}")
    ours = [peaks.per_pid[p] for p in peaks.own | peaks.workers if p in peaks.per_pid]
    worker = max((peaks.per_pid[p] for p in peaks.workers), default=None)
    return Run(
        round(wall, 2),
        round(max(ours, default=0.0), 1),
        round(peaks.total_mb, 1),
        None if worker is None else round(worker, 1),
    )


def trainer_argv(warehouse: str, table: str, model_dir: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "trainer.train",
        f"--input-table={table}", f"--start-ds={DAYS[0]}", f"--end-ds={DAYS[-1]}",
        f"--warehouse={warehouse}", f"--model-dir={model_dir}",
        f"--features={','.join(FEATURES)}", f"--num-rounds={ROUNDS}", "--eval-days=1",
        *extra,
    ]  # fmt: skip


def save(results: dict[str, Any]) -> None:
    SCALING.parent.mkdir(parents=True, exist_ok=True)
    SCALING.write_text(json.dumps(results, indent=2))
