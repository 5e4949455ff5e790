"""What Ray's own processes take of the machine while a fan-out trains: the CPU of every
process under the Ray head (raylet, GCS, dashboard and its modules, agents, log monitor,
the job's supervisor) other than the training ones (the job's driver and the pool's
workers), sampled from ``/proc`` four times a second, averaged over the samples in
which the training processes used ``busy`` cores or more (both slots training); and how
busy the whole machine was over the same samples (``/proc/stat``).

Linux only (``/proc``); it reads, never signals, any process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds (user + system), from one read of its stat."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _command(pid: int) -> str | None:
    """The command line of ``pid`` (None once it has ended): read on every sample, since
    Ray retitles a worker when it becomes an actor."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, every process and the
    kernel: all of /proc/stat's first line but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


@dataclass
class RayShare:
    """Samples, in a background thread between ``start`` and ``stop``, the CPU of the
    processes under ``root`` (the head's), split by ``training`` (a command line ->
    whether it is one of the training processes)."""

    root: int
    training: Callable[[str], bool]
    interval: float = 0.25
    #: (seconds, cores of the training processes, cores of the rest, cores the whole
    #: machine was busy) per sample
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-share", daemon=True)

    def start(self) -> RayShare:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> dict[int, tuple[float, bool]]:
        procs = _processes()
        out = {}
        for pid in descendants(self.root, {p: ppid for p, (ppid, _) in procs.items()}):
            cmd = _command(pid)
            if pid in procs and cmd is not None:
                out[pid] = (procs[pid][1], self.training(cmd))
        return out

    def _run(self) -> None:
        before, machine, t0 = self._read(), machine_busy(), time.monotonic()
        while not self._stop.wait(self.interval):
            now, machine_now, t1 = self._read(), machine_busy(), time.monotonic()
            used = {True: 0.0, False: 0.0}
            for pid, (cpu, trains) in now.items():
                # a process first seen now started within the interval: all its CPU is new
                used[trains] += cpu - (before[pid][0] if pid in before else 0.0)
            span = t1 - t0
            self.samples.append(
                (span, used[True] / span, used[False] / span, (machine_now - machine) / span)
            )
            before, machine, t0 = now, machine_now, t1

    def _mean(self, busy: float, column: int) -> float | None:
        steady = [(s[0], s[column]) for s in self.samples if s[1] >= busy]
        total = sum(span for span, _ in steady)
        return sum(span * value for span, value in steady) / total if total else None

    def while_training(self, busy: float) -> float | None:
        """Mean cores the rest used over the samples with the training processes at
        ``busy`` cores or more (None: no such sample)."""
        return self._mean(busy, 2)

    def machine_while_training(self, busy: float) -> float | None:
        """Mean cores the whole machine was busy over the same samples: the training
        processes, the rest under the root, and everything else (the Dagster step
        following the job, the OS)."""
        return self._mean(busy, 3)
