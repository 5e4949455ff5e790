"""Run a training request as a local subprocess: the development launcher.

Same archive (verified, unpacked the way Ray unpacks it: the single top-level folder
stripped) and the same runtime build (first on the trainer's ``PYTHONPATH``, as Ray's
``py_modules`` puts it), same ``python -m`` command and flags, same paths and report; the
trainer's output streams into the log. Requirements are not installed: they must already be
satisfied in this environment, and an unmet one fails before anything runs.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from zipline_dagster.jobs.cost import Usage
from zipline_dagster.jobs.request import (
    JobOutcome,
    JobRequest,
    TrainingJobError,
    traceback_tail,
)
from zipline_dagster.packaging import RuntimeArchive


class LocalLaunchError(TrainingJobError):
    """The local trainer could not start, failed, was interrupted or timed out."""


def unmet_requirements(requirements: list[str]) -> list[str]:
    from packaging.requirements import Requirement

    unmet = []
    for spec in requirements:
        req = Requirement(spec)
        try:
            installed = importlib_metadata.version(req.name)
        except importlib_metadata.PackageNotFoundError:
            unmet.append(f"{spec} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            unmet.append(f"{spec} (installed {installed})")
    return unmet


def unpack_archive(archive: bytes, dest: Path) -> None:
    """Unpack like Ray does for a remote working_dir: strip the single top-level folder."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for info in zf.infolist():
            _top, _, rel = info.filename.partition("/")
            if not rel or info.is_dir():
                continue
            target = (dest / rel).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise LocalLaunchError(
                    f"archive entry {info.filename!r} escapes the working directory"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)


class LocalRunner:
    def __init__(
        self, *, timeout_s: float, log: logging.Logger | logging.LoggerAdapter[Any] | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.log = log or logging.getLogger(__name__)

    def run(
        self,
        request: JobRequest,
        *,
        archive: bytes,
        runtime: RuntimeArchive,
        requirements: list[str],
        metadata: dict[str, str],
    ) -> JobOutcome:
        unmet = unmet_requirements(requirements)
        if unmet:
            raise LocalLaunchError(
                f"the local launcher runs the trainer in this environment, which does not satisfy its "
                f"install_requires: {', '.join(unmet)}; install them or use the Ray launcher"
            )
        started = time.monotonic()
        job = request.for_attempt(f"local-{request.job_key}-{uuid.uuid4().hex[:8]}")
        workdir = Path(tempfile.mkdtemp(prefix=f"zd-{request.job_key}-"))
        try:
            unpack_archive(archive, workdir / "job")
            unpack_archive(runtime.data, workdir / "runtime")
            return self._run_in(workdir, job, started)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _run_in(self, workdir: Path, request: JobRequest, started: float) -> JobOutcome:
        argv = [sys.executable, *request.argv[1:]]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **request.threads_env, **request.env}
        # the model's runtime build first on the path, as Ray's py_modules puts it
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(workdir / "runtime"), env.get("PYTHONPATH")])
        )
        proc = subprocess.Popen(
            argv,
            cwd=workdir / "job",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        job_id = request.attempt_id or f"local-{request.job_key}-{proc.pid}"
        self.log.info(f"started local trainer {job_id}: {request.entrypoint}")
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        logs: list[str] = []
        done = False
        try:
            while not done:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = ""
                if line is None:
                    done = True
                elif line:
                    logs.append(line)
                    self.log.info(f"[{job_id}] {line}")
                if time.monotonic() - started > self.timeout_s:
                    self._stop(proc)
                    raise LocalLaunchError(
                        f"local trainer {job_id} timed out after {self.timeout_s:.0f}s and was stopped",
                        job_id=job_id,
                        logs_tail=traceback_tail("\n".join(logs)),
                    )
            # the child's own CPU-seconds and peak memory, as the kernel counted them
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except BaseException:
            self._stop(proc)
            raise
        text = "\n".join(logs)
        if proc.returncode != 0:
            tail = traceback_tail(text)
            raise LocalLaunchError(
                f"local trainer {job_id} FAILED (exit code {proc.returncode})\n--- trainer output (tail) ---\n{tail}",
                job_id=job_id,
                logs_tail=tail,
            )
        return JobOutcome(
            job_id=job_id,
            status="SUCCEEDED",
            dashboard_url=None,
            attached=False,
            seconds=time.monotonic() - started,
            logs=text,
            launcher="local",
            model_dir=request.model_dir,
            usage=Usage(
                seconds=time.monotonic() - started,
                cpu_s=rusage.ru_utime + rusage.ru_stime,
                peak_mem_mb=rusage.ru_maxrss / 1024,
            ),
        )

    @staticmethod
    def _stop(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
