"""The host's own ceiling for the fan-out, outside Ray: one process training the fan-out
trainer's models one after another against two processes training half of them each,
side by side, on the same data. No Ray, no Dagster: what two training processes get from
this machine's 2 cores, which bounds what the driver and a worker can reach.

``side_by_side`` runs the processes (``python -m tests.bench.host_pair`` each): every
one loads the data as the trainer does, trains one model (imports done), says it is
ready, and starts training its share when told to, so that loading is not timed and the
processes start together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainers" / "market_ctr_models"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--warehouse", required=True)
    p.add_argument("--models", type=int, required=True, help="the first N segments, by name")
    p.add_argument("--part", type=int, default=0)
    p.add_argument("--parts", type=int, default=1)
    p.add_argument("trainer_flags", nargs="*", help="after --: the trainer's data flags")
    args = p.parse_args(argv)

    import trainer.train as tt
    from trainer.fanout import train_batch
    from zipline_runtime import trainer_io as tio

    flags = [*args.trainer_flags, "--executor=serial", "--model-dir=file:///unused"]
    targs = tt.parse_args([*flags, f"--warehouse={args.warehouse}"])
    files = tio.flags_window_files(targs)
    head = files.read_table([targs.segment_column, targs.label_column], (targs.segment_column,))
    codes, names = tt.segment_codes(head, targs.segment_column)
    features = targs.features.split(",")  # the bench names them
    body = files.read_table(features)
    window = tio.window_days(targs.start_ds, targs.end_ds)
    holdout = window[len(window) - targs.eval_days :]  # as the trainer: the last days
    data = tt.split_by_segment(head, body, codes, names, targs, features, holdout)
    mine = sorted(data)[: args.models][args.part :: args.parts]
    conf = {"max_depth": targs.max_depth, "num_rounds": targs.num_rounds}
    train_batch(mine[:1], data, conf)  # imports done, outside the timing
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    t0 = time.perf_counter()
    results = train_batch(mine, data, conf)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "models": len(results)}), flush=True)
    return 0


def side_by_side(warehouse: str, flags: list[str], models: int, processes: int) -> float:
    """Seconds until the last of ``processes`` processes, started together, has trained
    its share of the first ``models`` segments of the data the trainer's ``flags`` name
    (table, window, segment column, features, rounds)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINER), str(ROOT)])}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="")
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.bench.host_pair", f"--warehouse={warehouse}"),
                *(f"--models={models}", f"--part={i}", f"--parts={processes}", "--"),
                *flags,
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        done = [json.loads(proc.communicate()[0]) for proc in procs]
    finally:
        for proc in procs:  # stopped exactly what it started
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sum(d["models"] for d in done) == models
    return max(d["seconds"] for d in done)


def uneven_pair(alone: list[float], paired: list[float]) -> str | None:
    """Why a run's ``side_by_side`` repeats (seconds of one process, of two, per repeat)
    say the host disturbed it, or None. Two processes on 2 cores cannot train more than
    twice as fast as one: a repeat above that had its one process slowed by the host (its
    cores running unevenly), and the single-process serial loop may have been slowed
    alike."""
    each = [a / p for a, p in zip(alone, paired, strict=True)]
    if max(each) <= 2:
        return None
    return (
        f"two bare processes trained {min(each):.2f}-{max(each):.2f}x one process's models "
        "per second across the repeats, more than 2 processes can: the host slowed the one "
        "process (its cores ran unevenly), so neither the ceilings nor the loop judge "
        "anything; run the benchmark again"
    )


if __name__ == "__main__":
    sys.exit(main())
