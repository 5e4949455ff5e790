"""The reference trainer reads its window batch by batch: it trains under a memory cap
smaller than the window's frame (where reading the frame, as it used to, is killed), it
trains from external memory when its budget says so, and a file that does not hold the
snapshot's columns is one error naming the table, the file and the column."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, tables_of, write_partition, write_table
from tests.support.memcap import MemoryCap
from tests.support.trainers import run_trainer

DS = "2026-07-10"
FEATURES = 40
#: The old path as the trainer ran it: the window as one pandas frame, copied to float64
#: numpy, into a plain DMatrix.
FRAME_PATH = """
import sys
from zipline_runtime import trainer_io as tio
from trainer.cli import parse_args

args = parse_args(sys.argv[1:])
xgb = tio.import_xgboost()
data = tio.read_flags_window(args)
cols = [c for c in data.columns if c not in (args.label_column, args.partition_column)]
xgb.DMatrix(data[cols].to_numpy(dtype=float), label=data[args.label_column].to_numpy())
print("built")
"""


def wide_rows(ds: str, rows: int, seed: int) -> pd.DataFrame:
    """``FEATURES`` float64 features of 16 levels each (small on disk, 8 bytes a value in
    a frame) and a label that two of them drive."""
    rng = np.random.default_rng(seed)
    levels = np.linspace(-2, 2, 16)
    cols = {f"f{j:02d}": levels[rng.integers(0, 16, rows)] for j in range(FEATURES)}
    logit = cols["f00"] - 0.5 * cols["f01"]
    cols["label"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return pd.DataFrame(cols)


def flags(base: str, table: str, out: Path) -> list[str]:
    return [
        f"--input-table={table}",
        f"--start-ds={days_ending(DS, 4)[0]}",
        f"--end-ds={DS}",
        f"--warehouse={base}",
        f"--model-dir={out.as_uri()}",
        "--num-rounds=10",
        "--eval-days=1",
    ]


def capped(cap: MemoryCap, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=TRAINERS / "listing_ctr_model",
        preexec_fn=cap.enter,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_window_larger_than_the_memory_cap_trains_where_its_frame_is_killed(
    file_base: str, tmp_path: Path
) -> None:
    rows_per_day = 750_000
    for n, ds in enumerate(days_ending(DS, 4)):
        write_partition(file_base, "ctr.wide", ds, wide_rows(ds, rows_per_day, n))
    frame_bytes = 4 * rows_per_day * (FEATURES + 1) * 8  # the float64 frame, no ds column
    limit = 800 * 2**20
    assert limit < frame_bytes  # the cap is smaller than the window's frame (984 MB)

    cap = MemoryCap(limit)
    try:
        out = tmp_path / "streamed"
        streamed = capped(
            cap,
            [sys.executable, "-m", "trainer.train", *flags(file_base, "ctr.wide", out),
             "--batch-rows=65536"],
        )  # fmt: skip
        assert streamed.returncode == 0, streamed.stdout[-3000:] + streamed.stderr[-3000:]
        assert cap.oom_kills == 0 and cap.peak <= limit
    finally:
        cap.close()
    report = json.loads((out / "metrics.json").read_text())
    assert report["train"]["rows"] == 3 * rows_per_day
    assert report["holdout"]["rows"] == rows_per_day
    assert report["holdout"]["metrics"]["auc"] > 0.7  # it learned f00 and f01
    assert report["matrix"]["kind"] == "in_memory"

    cap = MemoryCap(limit)
    try:  # the same window read as one frame, under the same cap: the kernel kills it
        frame = capped(
            cap,
            [sys.executable, "-c", FRAME_PATH, *flags(file_base, "ctr.wide", tmp_path / "f")],
        )
        assert frame.returncode != 0 and "built" not in frame.stdout
        assert cap.oom_kills >= 1 or "MemoryError" in frame.stderr, frame.stderr[-2000:]
    finally:
        cap.close()


def test_a_budget_smaller_than_the_matrix_trains_from_external_memory(
    file_base: str, tmp_path: Path
) -> None:
    write_table(file_base, "ctr.t", days_ending(DS, 4), rows=3000)
    base_flags = flags(file_base, "ctr.t", tmp_path / "mem")
    in_memory = run_trainer(*base_flags, "--batch-rows=1000")
    assert in_memory.returncode == 0, in_memory.stdout + in_memory.stderr
    external = run_trainer(
        *flags(file_base, "ctr.t", tmp_path / "ext"), "--batch-rows=1000", "--memory-budget=50000"
    )
    assert external.returncode == 0, external.stdout + external.stderr
    mem = json.loads((tmp_path / "mem" / "metrics.json").read_text())
    ext = json.loads((tmp_path / "ext" / "metrics.json").read_text())
    assert (
        mem["matrix"]["kind"] == "in_memory" and mem["matrix"]["reason"] == "no memory budget set"
    )
    assert ext["matrix"]["kind"] == "external_memory"
    assert "exceeds the memory budget (50,000 bytes)" in ext["matrix"]["reason"]
    # the same rows, the same sketch: the same model either way
    assert ext["holdout"]["metrics"]["auc"] == pytest.approx(mem["holdout"]["metrics"]["auc"])
    assert ext["train"]["rows"] == mem["train"]["rows"] == 9000


def test_a_file_without_a_column_of_the_snapshot_is_named(file_base: str, tmp_path: Path) -> None:
    days = days_ending(DS, 3)
    for ds in days[:-1]:
        write_partition(file_base, "ctr.t", ds, ctr_rows(ds, 200))
    # the table gains a column (Iceberg schema evolution); only the last day's file has it
    table = tables_of(file_base).load("ctr.t")
    with table.update_schema() as update:
        update.add_column("discount", _double())
    write_partition(file_base, "ctr.t", days[-1], ctr_rows(days[-1], 200).assign(discount=0.1))
    res = run_trainer(
        "--input-table=ctr.t",
        f"--start-ds={days[0]}",
        f"--end-ds={DS}",
        f"--model-dir={(tmp_path / 'o').as_uri()}",
        f"--warehouse={file_base}",
        "--features=price_log,discount",
    )
    assert res.returncode == 2, res.stdout + res.stderr
    said = res.stdout
    assert "table ctr.t: file " in said and f"ds={days[0]}" in said, said
    assert "has no column 'discount' that the snapshot's schema has (double)" in said, said
    assert not (tmp_path / "o").exists()  # nothing half-written


def _double() -> object:
    from pyiceberg.types import DoubleType

    return DoubleType()
