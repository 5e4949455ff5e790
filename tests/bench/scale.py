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

from tests.bench.ray_share import _command, _processes, descendants

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
            parents = {pid: ppid for pid, (ppid, _) in _processes().items()}
            self.own.update(descendants(self.roots[0], parents))
            pids = {p for r in self.roots for p in descendants(r, parents)}
            rss = {p: _rss_kb(p) / 1024 for p in pids}
            self.total_mb = max(self.total_mb, sum(rss.values()))
            for p, mb in rss.items():
                self.per_pid[p] = max(self.per_pid.get(p, 0.0), mb)
                if p not in self.own and "RayTrainWorker" in (_command(p) or ""):
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def goals(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 68's goals over ``results``: (goal, the measured value, met)."""
    sizes = {s["rows"]: s for s in results["sizes"]}
    if not sizes:
        return []
    out: list[tuple[str, str, bool | None]] = []
    big = max(sizes)
    for rows, s in sorted(sizes.items()):
        a, b, c = s["hand"], s["inprocess"], s["ray"]
        if rows >= 4_000_000:
            r = _ratio(b["wall_s"], a["wall_s"])
            out.append(
                (f"{rows:,} rows: (b) wall <= 1.15x (a)", f"{r:.2f}x", r is not None and r <= 1.15)
            )
        r = _ratio(b["largest_mb"], a["largest_mb"])
        out.append(
            (
                f"{rows:,} rows: (b) largest process <= 1.2x (a)'s",
                f"{r:.2f}x",
                r is not None and r <= 1.2,
            )
        )
        r = _ratio(c["worker_mb"], b["largest_mb"])
        out.append(
            (
                f"{rows:,} rows: (c) each worker's peak <= 0.6x (b)'s",
                f"{r:.2f}x",
                r is not None and r <= 0.6,
            )
        )
        r = _ratio(c["wall_s"], a["wall_s"])
        out.append(
            (f"{rows:,} rows: (c) wall <= 1.5x (a)", f"{r:.2f}x", r is not None and r <= 1.5)
        )
    s = sizes[big]
    top = max(s["inprocess"]["largest_mb"], s["ray"]["largest_mb"])
    share = top / s["frame_mb"]
    out.append((f"{big:,} rows: no process of (b) or (c) above 40% of the float64 frame ({s['frame_mb']:.0f} MB)",
                f"{top:.0f} MB, {share:.0%}", share <= 0.4))  # fmt: skip
    if 4_000_000 in sizes and big > 4_000_000:
        per = [sizes[n]["inprocess"]["wall_s"] / n for n in (4_000_000, big)]
        r = per[1] / per[0]
        out.append(
            (
                f"(b) time per row flat from 4M to {big // 10**6}M within 1.25x",
                f"{r:.2f}x",
                r <= 1.25,
            )
        )
    sc = results.get("scoring")
    if sc:
        r = _ratio(sc["runtime"]["wall_s"], sc["hand"]["wall_s"])
        out.append(
            (
                f"scoring {sc['rows']:,} rows: wall <= 1.2x by hand",
                f"{r:.2f}x",
                r is not None and r <= 1.2,
            )
        )
        peak = sc["runtime"]["largest_mb"]
        out.append((f"scoring {sc['rows']:,} rows: peak <= 1.5 GB", f"{peak:.0f} MB", peak <= 1536))
    return out


def render(results: dict[str, Any]) -> str:
    """The scaling section of docs/benchmarks.md."""
    lines = [
        "## Data at scale: training and scoring from streamed batches",
        "",
        f"`tests/bench/test_scale_bench.py`: a 4-day window of a synthetic Iceberg table (8 "
        f"float features, a label), {results['rounds']} rounds of depth 4, 2 threads. (a) "
        "xgboost by hand: pyiceberg scan, QuantileDMatrix of the training days, holdout "
        "predicted (the limit); (b) the model partition in-process (`python -m "
        "trainer.train`); (c) the same on 2 Ray Train workers on the 2-CPU head. Medians "
        "of 3 runs (the largest size: 1 run). Memory: peak resident set sampled from "
        "`/proc` 10 times a second; largest = the largest of the run's own processes and "
        "its Ray Train workers; (c)'s all = every process under the Ray head too.",
        "",
        "| rows | float64 frame | (a) wall / largest | (b) wall / largest / rows/s | (c) wall / worker / all | matrix |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in results["sizes"]:
        a, b, c = s["hand"], s["inprocess"], s["ray"]
        lines.append(
            f"| {s['rows']:,} | {s['frame_mb']:.0f} MB | {a['wall_s']:.1f} s / {a['largest_mb']:.0f} MB "
            f"| {b['wall_s']:.1f} s / {b['largest_mb']:.0f} MB / {s['rows'] / b['wall_s']:,.0f} "
            f"| {c['wall_s']:.1f} s / {c['worker_mb'] or 0:.0f} MB / {c['total_mb']:.0f} MB | {s['matrix']} |"
        )
    sc = results.get("scoring")
    if sc:
        lines += [
            "",
            f"Scoring a {sc['rows']:,}-row day ({sc['files']} files): the runtime's scorer "
            f"(batches, files of 4 batches, drift counted) {sc['runtime']['wall_s']:.1f} s, "
            f"peak {sc['runtime']['largest_mb']:.0f} MB; by hand (each file read, predicted, "
            f"its scores written) {sc['hand']['wall_s']:.1f} s, peak {sc['hand']['largest_mb']:.0f} MB.",
        ]
    lines += ["", "| goal | measured | verdict |", "| --- | --- | --- |"]
    for goal, value, met in goals(results):
        verdict = "-" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {goal} | {value} | {verdict} |")
    return "\n".join(lines) + "\n"
