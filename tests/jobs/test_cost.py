"""What a partition cost: measured by the driver in the process that ran it (a real
interpreter running real modules, twice in one process as a warm Ray worker does), and
the metadata Dagster plots."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from zipline_dagster.jobs.cost import Cost, Usage

RUN_TWO = """
import json, sys
sys.path.insert(0, sys.argv[1])
from zipline_runtime.driver import run_partition
big = run_partition("big", [])
small = run_partition("small", [])
sys.__stdout__.write(json.dumps({"big": big, "small": small}))
"""


def test_each_run_of_a_warm_process_is_measured_on_its_own(tmp_path: Path) -> None:
    # 400 MB touched and ~0.6 CPU-s burnt by the first partition; almost nothing by the
    # second, run next in the same process: its peak is its own, not the first one's
    (tmp_path / "big.py").write_text(
        textwrap.dedent(
            """
            import time
            block = bytearray(400 * 1024 * 1024)
            block[::4096] = b"x" * len(block[::4096])
            end = time.process_time() + 0.6
            while time.process_time() < end:
                pass
            """
        )
    )
    (tmp_path / "small.py").write_text("print('hello')\n")
    done = subprocess.run(
        [sys.executable, "-c", RUN_TWO, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    runs = json.loads(done.stdout[done.stdout.index("{") :])
    big, small = runs["big"], runs["small"]
    assert big["exit_code"] == 0 and small["exit_code"] == 0
    assert big["cpu_s"] >= 0.55 and small["cpu_s"] < 0.3
    assert big["peak_mem_mb"] > 400
    assert small["peak_mem_mb"] < big["peak_mem_mb"] - 300  # the first run's peak was reset


def test_a_range_jobs_wall_time_is_split_evenly_and_said() -> None:
    cost = Cost(job_s=40.0, days_in_job=4, usage=Usage(seconds=8.0, cpu_s=6.5, peak_mem_mb=300))
    md = cost.metadata(rows=16_000)
    assert md["cost/wall_s"] == dg.MetadataValue.float(10.0)
    assert md["cost/run_s"] == dg.MetadataValue.float(8.0)
    assert md["cost/cpu_s"] == dg.MetadataValue.float(6.5)
    assert md["cost/rows_per_s"] == dg.MetadataValue.float(2000.0)
    assert "one Ray job for 4 partitions" in md["cost/split"].value
    assert "40.0s wall time split evenly" in md["cost/split"].value
    assert cost.line() == "10.0s wall, 6.5 CPU-s, peak 300 MB, 1/4 of a range job"


def test_a_day_without_its_result_line_records_its_wall_time_only() -> None:
    # a driver that died before printing its result: what the job took, and no guesses
    assert Usage.of(None) is None and Usage.of({"exit_code": 0}) is None
    md = Cost(job_s=12.0).metadata(rows=100)
    assert set(md) == {"cost/wall_s", "cost/split"}
    assert md["cost/split"].value.startswith("a job of its own")


@pytest.mark.parametrize("line", [{"seconds": 2.0}, {"seconds": 2, "cpu_s": None}])
def test_a_result_line_of_an_older_driver_has_no_cpu_or_memory(line: dict[str, float]) -> None:
    # a trainer archive built before the driver measured them: its run time only
    usage = Usage.of(line)
    assert usage == Usage(seconds=2.0)
    assert set(Cost(4.0, 1, usage).metadata(rows=10)) == {
        "cost/wall_s",
        "cost/split",
        "cost/run_s",
        "cost/rows_per_s",
    }
