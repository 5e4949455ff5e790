"""Benchmark bookkeeping: every case repeats (3 or more), reports min/median/max of its
measurement and of a baseline measured in the same run, their ratio, and a goal with a
verdict. ``make bench`` prints one summary table at the end and writes the results to
``tests/bench/results/latest.json``; ``python -m tests.bench.report`` renders
docs/benchmarks.md from that file (never edited by hand).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
MIN_REPEATS = 3


@dataclass
class Series:
    """Repeated measurements of one thing, in seconds (or another unit)."""

    label: str
    values: list[float]
    unit: str = "s"

    def __post_init__(self) -> None:
        if len(self.values) < MIN_REPEATS:
            raise ValueError(f"{self.label}: {len(self.values)} repeats, need {MIN_REPEATS}+")

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def spread(self) -> str:
        v = self.values
        return f"{min(v):.2f} / {self.median:.2f} / {max(v):.2f} {self.unit}"


@dataclass
class Case:
    """One row of the summary: measured vs baseline, and a goal on some quantity."""

    name: str
    baseline: Series | None
    measured: Series
    goal: str
    #: the number the goal is about (a ratio of medians, or the measured median)
    value: float
    value_text: str
    met: bool | None
    notes: list[str] = field(default_factory=list)
    #: why the run cannot judge the goal (a baseline slowed by something outside the
    #: comparison, say): the verdict is then "disturbed", whatever the ratio
    disturbed: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline.median == 0:
            return None
        return self.measured.median / self.baseline.median

    @property
    def verdict(self) -> str:
        if self.disturbed:
            return "**disturbed** (not judged)"
        return "-" if self.met is None else ("met" if self.met else "**missed**")


_CASES: list[Case] = []


def repeat(fn: Callable[[], float | None], times: int = MIN_REPEATS) -> list[float]:
    """Run ``fn`` ``times`` times; each returns its own measurement (or None: wall time)."""
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        value = fn()
        out.append(time.perf_counter() - t0 if value is None else float(value))
    return out


def record(case: Case) -> Case:
    _CASES.append(case)
    base = f"{case.baseline.label} {case.baseline.spread()}; " if case.baseline else ""
    print(
        f"\n[bench] {case.name}: {base}{case.measured.label} {case.measured.spread()} "
        f"(min / median / max); {case.value_text}; goal {case.goal}: {case.verdict}"
        + "".join(f"\n    {n}" for n in case.notes)
        + (f"\n    disturbed: {case.disturbed}" if case.disturbed else ""),
        flush=True,
    )
    return case


def summary_table(cases: list[Case] | None = None) -> str:
    rows = [
        "| case | baseline (min / median / max) | measured (min / median / max) | ratio of medians | goal | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in _CASES if cases is None else cases:
        base = f"{c.baseline.label}: {c.baseline.spread()}" if c.baseline else "-"
        ratio = f"{c.ratio:.2f}x" if c.ratio is not None else "-"
        rows.append(
            f"| {c.name} | {base} | {c.measured.label}: {c.measured.spread()} | {ratio} | "
            f"{c.goal} ({c.value_text}) | {c.verdict} |"
        )
    return "\n".join(rows)


def write_results(seconds: float) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {_cpus()} CPUs, {_mem_gib():.0f} GiB, Python {platform.python_version()}",
        "bench_seconds": round(seconds, 1),
        "cases": [
            {**asdict(c), "ratio": c.ratio, "verdict": c.verdict, "table_row": None} for c in _CASES
        ],
        "table": summary_table(),
    }
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(RESULTS)


def cases() -> list[Case]:
    return list(_CASES)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _mem_gib() -> float:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
