"""The driver every job runs under, and what crosses from the job to the step.

Every job the platform submits (a model partition, a scores day, or a range of either)
runs under this module as its driver, ``python -m zipline_runtime.driver``: the runtime
reaches the job beside the trainer's archive, so the job needs nothing of the platform
installed. What crosses from the job to the step, and nothing else:

* **attempts**: each partition's flags are pointed at the job's attempt
  (``attempt_flags``): a trainer writes into ``{model-dir}/_attempts/{submission id}``,
  an inference module names its file after it (``--write-id``);
* **result lines**: one line per partition, ``zipline-partition-result {json}`` (its
  ``ds``, exit code, seconds, CPU-seconds and peak memory of its run, and a failed
  partition's output tail), printed as each one finishes; the step reads them with
  ``partition_results``, so a failing partition fails only itself;
* **the end**: just before it exits the driver writes a marker file
  (``done_marker``: ``_attempts/{submission id}.done`` beside the attempts) holding every
  result line and the last one, then prints that last line, ``zipline-partitions-done
  ...``. The step learns the job is ending from whichever it sees first (``DoneWatcher``
  on storage, the line in the log stream) and only then polls Ray's status tightly. It
  reads a range's results from the marker, storage being the truth, and from the log
  only what the marker lacks (a driver that could not write it): on a cluster of many
  nodes Ray may hand the step an incomplete log, which would fail days that trained.

A single partition runs in the driver's own process (``--in-process``: the trainer is
the job's driver, as with ``python -m {module}``); a range runs one Ray task per
partition (``--num-cpus`` each), on workers that stay warm between partitions. Standard
library, plus Ray in a range job; the marker is written through ``trainer_io``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from zipline_runtime import trainer_io as tio
from zipline_runtime.contract import RESULT_PREFIX, partition_results, result_line

__all__ = ["RESULT_PREFIX", "partition_results"]

#: The driver's module (``python -m zipline_runtime.driver``).
DRIVER_MODULE = "zipline_runtime.driver"
#: Lines of a failed partition's output its result line carries.
TAIL_LINES = 60
#: Output a partition run in the driver's own process keeps for that tail: the end of it
#: only, however much the trainer prints over hours (its stream goes to Ray's log as is).
TAIL_CHARS = 1 << 20
#: The driver's last line: the platform stops waiting for Ray's status to catch up.
DONE_PREFIX = "zipline-partitions-done "
#: Each training attempt writes into ``{model-dir}/_attempts/{attempt id}``; the platform
#: promotes a successful one into ``{model-dir}``.
ATTEMPTS_DIR = "_attempts"
#: The flags that can name a partition's attempt: a trainer's ``--model-dir`` (pointed at
#: an attempt folder below it) or an inference module's ``--write-id`` (which names the
#: file it writes).
ATTEMPT_FLAGS = ("model-dir", "write-id")


def driver_argv(
    attempt_id: str,
    module: str,
    partitions: dict[str, list[str]],
    *,
    attempt_flag: str = "model-dir",
    num_cpus: float | None = None,
    done_uri: str = "",
) -> list[str]:
    """The job's command: the driver running ``module`` for each partition's flags (one
    partition without ``num_cpus``: in the driver's own process; else one task each)."""
    return [
        "python",
        "-m",
        DRIVER_MODULE,
        f"--attempt-id={attempt_id}",
        f"--module={module}",
        *([f"--attempt-flag={attempt_flag}"] if attempt_flag != "model-dir" else []),
        *(["--in-process"] if num_cpus is None else [f"--num-cpus={num_cpus:g}"]),
        f"--partitions={json.dumps(partitions, separators=(',', ':'))}",
        *([f"--done-uri={done_uri}"] if done_uri else []),
    ]


def done_marker(marker_dir: str, submission_id: str) -> str:
    """Where the driver of job ``submission_id`` writes its end marker."""
    return tio.join(marker_dir, ATTEMPTS_DIR, submission_id) + ".done"


class _Tee:
    """A worker's stdout/stderr, also copied into the current partition's buffer.

    Installed once per worker process and re-pointed per task: a trainer's logging
    handler (bound to ``sys.stdout`` when first configured) keeps writing here, so the
    next partition's lines land in the next partition's buffer.
    """

    def __init__(self, real: Any) -> None:
        self.real = real
        self.captured: list[str] | _Tail = []

    def write(self, text: str) -> int:
        self.captured.append(text)
        self.real.write(text)  # a worker's stream may return None
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _Tail:
    """The end of what was written: whole writes, dropped from the front once they add
    up to more than ``limit`` characters (the last write is always kept)."""

    def __init__(self, limit: int) -> None:
        import collections

        self.limit = limit
        self.parts: collections.deque[str] = collections.deque()
        self.size = 0

    def append(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)
        while self.size > self.limit and len(self.parts) > 1:
            self.size -= len(self.parts.popleft())

    def __iter__(self) -> Any:
        return iter(self.parts)


def attempt_flags(flags: list[str], attempt_id: str, flag: str = "model-dir") -> list[str]:
    """The one place a partition's flags are pointed at an attempt (the platform's
    launches and the range driver both use it): ``--model-dir=X`` becomes
    ``X/_attempts/{attempt_id}``; ``--write-id=W`` becomes ``--write-id={attempt_id}``."""
    prefix = f"--{flag}="
    if flag == "model-dir":
        return [
            f"{prefix}{tio.join(f[len(prefix) :], ATTEMPTS_DIR, attempt_id)}"
            if f.startswith(prefix)
            else f
            for f in flags
        ]
    return [f"{prefix}{attempt_id}" if f.startswith(prefix) else f for f in flags]


def run_partition(
    module: str, flags: list[str], *, tail_chars: int | None = None
) -> dict[str, Any]:
    """Run one partition's trainer (``python -m {module} {flags}``) in this process and
    return its exit code, seconds and output (``tail_chars``: only about that much of its
    end, for a caller that needs the tail only)."""
    import runpy
    import sys
    import traceback

    out: list[str] | _Tail = [] if tail_chars is None else _Tail(tail_chars)
    tees = []
    for name in ("stdout", "stderr"):
        tee = getattr(sys, name)
        if not isinstance(tee, _Tee):
            tee = _Tee(tee)
            setattr(sys, name, tee)
        tee.captured = out
        tees.append(tee)
    saved = sys.argv
    sys.argv = [module, *flags]
    usage = _Usage()
    started = time.time()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the trainer raised: its traceback is its log's tail
        traceback.print_exc()
        code = 1
    finally:
        sys.argv = saved
        for tee in tees:
            tee.flush()
            tee.captured = []
    return {
        "exit_code": code,
        "seconds": round(time.time() - started, 3),
        **usage.since(),
        "log": "".join(out),
    }


class _Usage:
    """What this process (and the children it waited for) used from now on: CPU-seconds
    (``getrusage``) and peak resident memory (Linux's high-water mark, reset here through
    ``/proc/self/clear_refs`` so that a warm worker's earlier partitions do not count;
    where it cannot be reset, the process's peak so far)."""

    def __init__(self) -> None:
        import resource

        self.cpu = self._cpu(resource)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    @staticmethod
    def _cpu(resource: Any) -> float:
        me, kids = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def since(self) -> dict[str, float]:
        import resource

        out = {"cpu_s": round(self._cpu(resource) - self.cpu, 3)}
        try:
            with open("/proc/self/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM:"))
            out["peak_mem_mb"] = round(int(hwm.split()[1]) / 1024, 1)
        except (OSError, StopIteration, ValueError):  # not Linux: the process's peak (KiB)
            out["peak_mem_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        return out


def run_partitions(argv: Any = None) -> int:
    """The range driver: one Ray task per partition, results as they finish."""
    import sys

    p = argparse.ArgumentParser(prog=f"python -m {DRIVER_MODULE}", description=__doc__)
    p.add_argument("--attempt-id", required=True, help="this job's submission id")
    p.add_argument("--module", required=True, help="the trainer module each partition runs")
    p.add_argument(
        "--attempt-flag",
        choices=ATTEMPT_FLAGS,
        default="model-dir",
        help="the partition flag that names its attempt: model-dir (a trainer: its attempt "
        "folder) or write-id (an inference module: the file it writes)",
    )
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per partition's task")
    p.add_argument("--partitions", required=True, help='JSON {"ds": [flags...], ...}')
    p.add_argument(
        "--done-uri",
        default="",
        help="a file this driver writes just before its last line: the platform watches "
        "storage for it to learn the job is ending sooner than the log stream says so",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the one partition in this driver (a single-partition job: the trainer "
        "is the job's driver, as with `python -m {module}`)",
    )
    args = p.parse_args(argv)
    partitions: dict[str, list[str]] = json.loads(args.partitions)
    started = time.time()
    failed = 0
    results: list[str] = []  # the result lines, for the end marker too

    def report(ds: str, result: dict[str, Any], *, echo: bool) -> None:
        nonlocal failed
        log = result.pop("log")
        if echo:
            for line in log.splitlines():
                print(f"[{ds}] {line}")
        result["ds"] = ds
        if result["exit_code"] != 0:
            failed += 1
            result["tail"] = "\n".join(log.splitlines()[-TAIL_LINES:])
        results.append(result_line(result))  # type: ignore[arg-type]
        print(results[-1], flush=True)

    if args.in_process:
        for ds, flags in partitions.items():
            report(
                ds,
                # the output went to the job's log as it came: only its tail is kept
                run_partition(
                    args.module,
                    attempt_flags(flags, args.attempt_id, args.attempt_flag),
                    tail_chars=TAIL_CHARS,
                ),
                echo=False,
            )
    else:
        import ray

        ray.init(log_to_driver=False)  # each partition's output comes back with its result
        task = ray.remote(num_cpus=args.num_cpus, max_retries=1)(run_partition)
        pending = {
            task.remote(args.module, attempt_flags(flags, args.attempt_id, args.attempt_flag)): ds
            for ds, flags in partitions.items()
        }
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ds = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as exc:  # the worker died (twice): the partition failed
                result = {"exit_code": -1, "seconds": 0.0, "log": f"{type(exc).__name__}: {exc}\n"}
            report(ds, result, echo=True)
    last_line = (
        f"{DONE_PREFIX}{len(partitions) - failed} of {len(partitions)} partitions succeeded in "
        f"{time.time() - started:.1f}s"
    )
    if args.done_uri:
        directory, _, name = args.done_uri.rpartition("/")
        try:
            tio.write_bytes(directory, name, "\n".join([*results, last_line]).encode())
        except Exception as exc:  # only a signal: the last line below says the same
            print(f"could not write {args.done_uri}: {type(exc).__name__}: {exc}", flush=True)
    print(last_line, flush=True)
    sys.stdout.flush()
    return 1 if failed else 0


def is_done_line(line: str) -> bool:
    """Whether a log line is the driver's last."""
    return line.startswith(DONE_PREFIX)


if __name__ == "__main__":
    import sys

    sys.exit(run_partitions())
