"""What a partition cost: the typed record a step builds from its job and its run's
result line (``zipline_runtime.driver``), and the materialization metadata Dagster plots across
partitions.

Measured where it is exact:

* **wall time** (``cost/wall_s``): the partition's share of its job's wall time, from
  submission to the end the step saw. A job of one partition is all its own; a range job
  (one Ray task per day) is split evenly across its days, and ``cost/split`` says so;
* **run time** (``cost/run_s``), **CPU-seconds** (``cost/cpu_s``) and **peak memory**
  (``cost/peak_mem_mb``) of the partition's own run, measured by the driver in the process
  that ran it (user + system time of the process and the children it waited for; Linux's
  resident high-water mark, reset at the run's start so that a warm worker's earlier days
  do not count). Ray's job and task state has neither CPU-seconds nor peak memory of a
  finished task, so the process is where they come from. Work a trainer hands to other
  Ray workers (Ray Train's actors) is not in them;
* **rows per second** (``cost/rows_per_s``): the rows the partition read (trained on and
  held out) or wrote (scored), over its run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg
from zipline_runtime.contract import PartitionResult


@dataclass(frozen=True)
class Usage:
    """A partition's run as its result line measured it."""

    seconds: float
    cpu_s: float | None = None
    peak_mem_mb: float | None = None

    @classmethod
    def of(cls, result: PartitionResult | None) -> Usage | None:
        """From a result line (None: no line, as from a driver that died first)."""
        if not result or "seconds" not in result:
            return None
        cpu, mem = result.get("cpu_s"), result.get("peak_mem_mb")
        return cls(
            float(result["seconds"]),
            None if cpu is None else float(cpu),
            None if mem is None else float(mem),
        )


@dataclass(frozen=True)
class Cost:
    """A partition's cost: its share of the job and its own run."""

    #: the job's wall time, and how many partitions it ran (its share is the quotient)
    job_s: float
    days_in_job: int = 1
    usage: Usage | None = None

    @property
    def wall_s(self) -> float:
        return self.job_s / max(self.days_in_job, 1)

    def split(self) -> str:
        if self.days_in_job <= 1:
            return "a job of its own: its wall time is the partition's"
        return (
            f"one Ray job for {self.days_in_job} partitions, one task each: the job's "
            f"{self.job_s:.1f}s wall time split evenly; run time, CPU and memory measured "
            "in the partition's own task"
        )

    def metadata(self, rows: int | None = None) -> dict[str, Any]:
        """``cost/*`` metadata (floats: plotted across partitions)."""
        md: dict[str, Any] = {
            "cost/wall_s": dg.MetadataValue.float(round(float(self.wall_s), 3)),
            "cost/split": dg.MetadataValue.text(self.split()),
        }
        u = self.usage
        if u is None:
            return md
        md["cost/run_s"] = dg.MetadataValue.float(round(float(u.seconds), 3))
        if u.cpu_s is not None:
            md["cost/cpu_s"] = dg.MetadataValue.float(round(float(u.cpu_s), 3))
        if u.peak_mem_mb is not None:
            md["cost/peak_mem_mb"] = dg.MetadataValue.float(round(float(u.peak_mem_mb), 1))
        if rows is not None and u.seconds > 0:
            md["cost/rows_per_s"] = dg.MetadataValue.float(round(float(rows / u.seconds), 1))
        return md

    def line(self) -> str:
        """One line for a person (the demo's)."""
        u = self.usage
        parts = [f"{self.wall_s:.1f}s wall"]
        if u is not None and u.cpu_s is not None:
            parts.append(f"{u.cpu_s:.1f} CPU-s")
        if u is not None and u.peak_mem_mb is not None:
            parts.append(f"peak {u.peak_mem_mb:.0f} MB")
        if self.days_in_job > 1:
            parts.append(f"1/{self.days_in_job} of a range job")
        return ", ".join(parts)
