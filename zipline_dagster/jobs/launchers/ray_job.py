"""Run one training request as a Ray Job and follow it to a terminal state.

Plain library code (no Dagster): the Dagster resource in ``resources.py`` wraps it.

* Submission ids are deterministic, ``zd-{model}-{version}-{ds}-{attempt}``: a retried or
  restarted step re-attaches to a live job for the same (model, version, ds) instead of
  starting a second one.
* The job's logs are forwarded line by line while it runs.
* The step learns a job is ending from the first of: a marker file the archive's driver
  writes just before it exits (``_attempts/{submission id}.done``, watched on storage),
  the driver's last log line, or a status poll (backing off to ``poll_max_s``). Only
  after one of those does it poll Ray's status every 50 ms, for the moment until Ray
  records the end, so the dashboard sees few requests.
* An interrupt (run cancelled, even twice) or the timeout (from the job's own start)
  stops the Ray job before the step ends; nothing else does: transient dashboard errors
  are retried for a tolerance while the job keeps running.
* Each attempt's trainer writes into its own folder (``_attempts/{submission id}``); the
  model asset promotes it into place only when it succeeded.
* Nothing secret goes into ``runtime_env`` or job metadata (both are shown verbatim by
  the dashboard); jobs inherit secrets from the cluster's own environment.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import time
from collections.abc import Callable
from typing import Any

from zipline_runtime.driver import done_marker, driver_argv

from zipline_dagster.jobs.channel import loggable_command
from zipline_dagster.jobs.launchers.ray_client import (
    REQUEST_TIMEOUT_S,
    RayDashboardLostError,
    RayUnreachableError,
    cluster_ray_version,
    http_address,
    is_not_found,
    is_transient,
    job_submission_client,
    short_error,
)
from zipline_dagster.jobs.launchers.ray_follow import LogFollower, done_watcher
from zipline_dagster.jobs.request import (
    JobOutcome,
    JobRequest,
    RangeJob,
    TrainingJobError,
    traceback_tail,
)
from zipline_dagster.packaging import RuntimeArchive
from zipline_dagster.storage.paths import model_runtime_uri

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
LIVE = frozenset({"PENDING", "RUNNING"})
_MAX_ATTEMPT_PROBE = 1000
#: how long after the driver's end signal the step polls Ray's status every 50 ms
TIGHT_POLL_S = 5.0
#: how long the log of a job that did not succeed is tried (its node may be gone)
FAILED_LOGS_S = 5.0


class RayJobError(TrainingJobError):
    """The Ray job failed, was stopped or timed out; carries the job id and log tail."""


class RayJobRunner:
    """Submit a training request as a Ray Job and follow it to a terminal state.

    Args:
        address: the cluster's dashboard address (``http://host:8265``).
        auth_mode: ``RAY_AUTH_MODE`` for this client (``disabled`` or ``token``).
        timeout_s: stop the job and fail after this long, counted from the job's own
            start time (a re-attached step does not restart the clock).
        poll_max_s: longest wait between status checks (polling backs off up to it).
        unreachable_tolerance_s: how long the dashboard may stay unreachable (connection
            errors, 5xx, requests without an answer) while following a job; the job keeps
            running meanwhile, and when the tolerance runs out the step fails saying a
            retry re-attaches.
        request_timeout_s: longest wait for the dashboard's answer to one request; a
            request without one counts as the dashboard being unreachable.
        entrypoint_resources: custom Ray resources every job's driver asks for (say
            ``{"worker": 0.001}``, a sliver of a resource only worker nodes have, to keep
            drivers off the head); None: none.
        install_requirements: install the trainer's ``install_requires`` into the job's
            environment (Ray's ``pip`` runtime env, cached per requirement set).
        log: receives the job's log lines and lifecycle messages.
        store: opens the storage the driver's end marker is watched on
            (``WarehouseResource.store``); None: as the settings say.

    Example:
        >>> runner = RayJobRunner(address="http://127.0.0.1:8265")  # doctest: +SKIP
        >>> outcome = runner.run(request, archive=data, requirements=[], metadata={})  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        address: str,
        auth_mode: str | None = None,
        timeout_s: float = 6 * 3600,
        poll_max_s: float = 2.0,
        unreachable_tolerance_s: float = 120.0,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        install_requirements: bool = True,
        entrypoint_resources: dict[str, float] | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        store: Callable[[str], Any] | None = None,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise TypeError(f"address must be a non-empty string, got {address!r}")
        if not (
            isinstance(request_timeout_s, (int, float))
            and not isinstance(request_timeout_s, bool)
            and 0 < request_timeout_s < math.inf
        ):
            raise ValueError(
                f"request_timeout_s={request_timeout_s!r} is invalid; expected seconds > 0 "
                "(the longest wait for one answer from the Ray dashboard)"
            )
        self.address = http_address(address)
        self.auth_mode = auth_mode
        self.timeout_s = timeout_s
        self.poll_max_s = poll_max_s
        self.unreachable_tolerance_s = unreachable_tolerance_s
        self.request_timeout_s = float(request_timeout_s)
        self.install_requirements = install_requirements
        self.entrypoint_resources = dict(entrypoint_resources or {})
        self.log = log or logging.getLogger(__name__)
        self.store = store
        self._client: Any = None
        self._lost_since: float | None = None
        self._last_warning = 0.0

    # -- connection -----------------------------------------------------------------
    def client(self) -> Any:
        if self._client is None:
            import ray

            if self.auth_mode:
                os.environ["RAY_AUTH_MODE"] = self.auth_mode
            version = cluster_ray_version(self.address, min(self.request_timeout_s, 5.0))
            if version != ray.__version__:
                raise RayUnreachableError(
                    f"Ray version mismatch: the cluster at {self.address} runs Ray {version}, this "
                    f"client has Ray {ray.__version__}; install ray=={version} here or run a "
                    f"{ray.__version__} cluster"
                )
            try:
                self._client = job_submission_client(self.address, self.request_timeout_s)
            except Exception as exc:
                raise RayUnreachableError(
                    f"cannot use the Ray Job API at {self.address} ({type(exc).__name__}: {exc})"
                ) from exc
        return self._client

    def _call(
        self,
        what: str,
        fn: Callable[[], Any],
        *,
        job: str | None = None,
        tolerance_s: float | None = None,
    ) -> Any:
        """``fn()``, retrying transient dashboard errors with backoff up to the tolerance
        (``tolerance_s``, default ``unreachable_tolerance_s``)."""
        tolerance = self.unreachable_tolerance_s if tolerance_s is None else tolerance_s
        delay = 0.5
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                now = time.monotonic()
                if self._lost_since is None:
                    self._lost_since = now
                lost = now - self._lost_since
                if lost > tolerance:
                    raise RayDashboardLostError(
                        f"lost contact with the Ray dashboard at {self.address} for {lost:.0f}s "
                        f"(tolerance {tolerance:.0f}s) while trying to {what} "
                        f"({type(exc).__name__}: {short_error(exc)}). "
                        + (
                            f"Ray job {job} was not stopped and may still be running on the "
                            "cluster; a retry of this step re-attaches to it (same submission id)."
                            if job
                            else "Nothing was submitted."
                        ),
                        job_id=job,
                    ) from exc
                if now - self._last_warning > 10 or lost == 0:
                    self._last_warning = now
                    self.log.warning(
                        f"Ray dashboard at {self.address} unreachable for {lost:.0f}s while trying "
                        f"to {what} ({type(exc).__name__}: {short_error(exc)}); retrying for up to "
                        f"{tolerance:.0f}s" + (f", job {job} keeps running" if job else "")
                    )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if self._lost_since is not None:
                self.log.warning(
                    f"Ray dashboard at {self.address} reachable again after "
                    f"{time.monotonic() - self._lost_since:.0f}s"
                )
                self._lost_since = None
            return result

    # -- ids and re-attachment ---------------------------------------------------------
    def _info(self, submission_id: str) -> Any | None:
        def get() -> Any | None:
            try:
                return self.client().get_job_info(submission_id)
            except Exception as exc:
                if is_not_found(exc):
                    return None
                raise

        return self._call(f"look up job {submission_id}", get)

    def find_attempt(self, job_key: str) -> tuple[int, Any | None]:
        """The latest attempt number for ``job_key`` and its job info (0, None if none)."""
        last, info = 0, None
        for n in range(1, _MAX_ATTEMPT_PROBE):
            found = self._info(f"zd-{job_key}-{n}")
            if found is None:
                break
            last, info = n, found
        return last, info

    # -- submit ------------------------------------------------------------------------
    def runtime_env(self, request: JobRequest, requirements: list[str]) -> dict[str, Any]:
        env_vars = {"PYTHONUNBUFFERED": "1"}
        pip = bool(requirements and self.install_requirements)
        if pip:
            # Ray's pip env is a copy of the cluster's Python environment made without its
            # .pyc files (its clone skips them), kept and reused per requirement set. Where
            # PYTHONDONTWRITEBYTECODE is set (common in images, and on this machine) every
            # process of every job would compile what it imports from source (ray, pandas,
            # xgboost: seconds of CPU each); an empty value lets the first
            # processes write the bytecode into that copy for the ones after them.
            env_vars["PYTHONDONTWRITEBYTECODE"] = ""
        env: dict[str, Any] = {
            "working_dir": request.archive_uri,
            # the runtime the project pins, beside the archive (first on the job's path)
            "py_modules": [model_runtime_uri(request.model)],
            # Platform settings only: runtime_env is shown verbatim by the dashboard.
            "env_vars": {**env_vars, **request.threads_env, **request.env},
        }
        if pip:
            env["pip"] = {"packages": requirements, "pip_check": False}
        return env

    def entrypoint(self, request: JobRequest, sid: str) -> str:
        """The job's command, always under the runtime's driver (``zipline_runtime.driver``): a
        partition (a model day, or a scores day) runs in the driver's own process, a range
        job is the driver itself; either way the driver signals the job's end."""
        done = done_marker(request.marker_dir, sid)
        if isinstance(request, RangeJob):  # the driver with its days
            return shlex.join([*request.for_attempt(sid).argv, f"--done-uri={done}"])
        return shlex.join(
            driver_argv(
                sid,
                request.module,
                {request.ds: list(request.flags)},
                attempt_flag=request.attempt_flag,
                done_uri=done,
            )
        )

    def submit_or_attach(
        self,
        request: JobRequest,
        *,
        requirements: list[str],
        metadata: dict[str, str],
        archive: bytes | None = None,
    ) -> tuple[JobRequest, bool]:
        """Re-attach to a live job for the same (model, version, ds), else submit one.

        Returns the request of the attempt being followed (its ``attempt_id`` is the
        submission id, its ``model_dir`` the attempt folder) and whether it re-attached.
        """
        attempt, info = self.find_attempt(request.job_key)
        if info is not None and str(info.status) in LIVE:
            sid = f"zd-{request.job_key}-{attempt}"
            self.log.info(
                f"re-attaching to live Ray job {sid} ({info.status}) instead of submitting again"
            )
            return request.for_attempt(sid), True
        sid = f"zd-{request.job_key}-{attempt + 1}"
        job = request.for_attempt(sid)
        entrypoint = self.entrypoint(request, sid)

        def submit() -> None:
            self.client().submit_job(
                entrypoint=entrypoint,
                submission_id=sid,
                runtime_env=self.runtime_env(job, requirements),
                metadata=metadata,
                # A distributed driver holds no CPU its own workers need.
                entrypoint_num_cpus=job.driver_cpus,
                entrypoint_memory=job.driver_memory,
                entrypoint_resources=self.entrypoint_resources or None,
            )

        try:
            self._call(f"submit job {sid}", submit)
        except Exception as exc:
            # another step submitted it a moment ago, or our own retried request did
            if "already exists" in str(exc):
                self.log.info(
                    f"Ray job {sid} already exists (submitted by another step); re-attaching"
                )
                return job, True
            raise
        self.log.info(f"submitted Ray job {sid}: {loggable_command(entrypoint)}")
        return job, False

    # -- follow ------------------------------------------------------------------------
    def stop(self, submission_id: str, wait_s: float = 20.0) -> str:
        """Stop the job and wait for a terminal state; repeated interrupts do not abort it."""
        deadline = time.monotonic() + wait_s
        requested = False
        status = "UNKNOWN"
        while time.monotonic() < deadline:
            try:
                if not requested:
                    self.client().stop_job(submission_id)
                    requested = True
                status = str(self.client().get_job_status(submission_id))
                if status in TERMINAL:
                    break
                time.sleep(0.25)
            except (KeyboardInterrupt, SystemExit):
                continue  # interrupted again while stopping: keep stopping
            except BaseException as exc:
                if type(exc).__name__ == "DagsterExecutionInterruptedError":
                    continue
                if isinstance(exc, Exception) and is_transient(exc):
                    time.sleep(0.5)
                    continue
                self.log.warning(f"could not stop Ray job {submission_id}: {exc}")
                break
        self.log.warning(f"Ray job {submission_id} stop requested; status {status}")
        return status

    def wait(self, job: JobRequest, *, attached: bool) -> JobOutcome:
        """Follow the attempt's job to a terminal state, forwarding its logs as they come.

        Only a run cancellation (an interrupt) or the timeout stops the job; a dashboard
        that stays unreachable past the tolerance fails the step and leaves the job be.
        """
        sid = job.attempt_id
        assert sid is not None
        follower = LogFollower(self.client, self.log, sid)
        follower.start()
        started = time.monotonic()
        try:
            info = self._call(f"follow job {sid}", lambda: self.client().get_job_info(sid), job=sid)
        except BaseException:
            follower.finish(None)  # its stream stops with the step
            raise
        # The job's own clock: a re-attached step does not restart the timeout.
        job_start = (info.start_time / 1000.0) if info.start_time else time.time()
        watcher = done_watcher(
            done_marker(job.marker_dir, sid), follower.ending, job_start, self.store
        )
        watcher.start()
        try:
            status = self._follow(sid, follower, str(info.status), job_start)
        finally:
            watcher.stop()
        # Once the driver's last line arrived the stream holds the whole log.
        full = None if follower.ended.is_set() else self._final_logs(sid, status)
        logs = follower.finish(full)
        if status != "SUCCEEDED":
            raise self._failed(sid, status, logs)
        return JobOutcome(
            job_id=sid,
            status=status,
            dashboard_url=self.address,
            attached=attached,
            seconds=time.monotonic() - started,
            logs=logs,
            model_dir=job.model_dir,
        )

    def _follow(self, sid: str, follower: LogFollower, status: str, job_start: float) -> str:
        """Poll the job's status until it is terminal (see ``wait``): often, briefly, once
        its driver signalled its end, else backing off to ``poll_max_s``."""
        delay = 0.2
        ending_since: float | None = None
        try:
            while status not in TERMINAL:
                if time.time() - job_start > self.timeout_s:
                    final = self.stop(sid)
                    logs = follower.finish(None)
                    raise RayJobError(
                        f"Ray job {sid} timed out after {self.timeout_s:.0f}s (counted from the "
                        f"job's start) and was stopped ({final})",
                        job_id=sid,
                        logs_tail=traceback_tail(logs),
                    )
                if follower.ending.is_set() and ending_since is None:
                    ending_since = time.monotonic()
                if ending_since is not None and time.monotonic() - ending_since < TIGHT_POLL_S:
                    # The driver wrote its marker or printed its last line: Ray's status
                    # follows within moments, so look often, briefly, not backing off (a
                    # driver that hangs on its way out gets the usual polls after that).
                    time.sleep(0.05)
                else:
                    follower.ending.wait(delay)
                    delay = min(delay * 1.5, self.poll_max_s)
                status = str(
                    self._call(
                        f"follow job {sid}", lambda: self.client().get_job_status(sid), job=sid
                    )
                )
        except RayJobError:
            raise
        except Exception:
            follower.finish(None)
            raise  # the dashboard is lost (or a bug): the job is left running, not stopped
        except BaseException:
            # Run cancelled (Dagster interrupts the step): never leave the job running
            # behind a step that has ended.
            follower.finish(None)
            if status not in TERMINAL:
                self.stop(sid)
            raise
        return status

    def _failed(self, sid: str, status: str, logs: str) -> RayJobError:
        """The error of a job that ended without succeeding: Ray's error type, the
        driver's exit code, its message's first line and the trainer output's tail."""
        info = self._call(f"read job {sid}", lambda: self.client().get_job_info(sid), job=sid)
        error_type = getattr(info, "error_type", None)
        exit_code = getattr(info, "driver_exit_code", None)
        tail = traceback_tail(logs or (info.message or ""))
        message = (info.message or "").strip().splitlines()
        first = message[0] if message else ""
        kind = ""
        if error_type:
            code = f", exit code {exit_code}" if exit_code is not None else ""
            kind = f" ({error_type}{code})"
        return RayJobError(
            f"Ray job {sid} {status}{kind}: {first}\n--- trainer output (tail) ---\n{tail}",
            job_id=sid,
            logs_tail=tail,
            logs=logs,
        )

    def _final_logs(self, sid: str, status: str) -> str | None:
        """An ended job's whole log. A job that failed may have lost its driver's node,
        where the log lives: its log is tried for ``FAILED_LOGS_S`` at most, then what the
        stream delivered stands (None), so a lost node fails the step at once instead of
        after the dashboard's tolerance."""
        what = f"read the logs of job {sid}"

        def read() -> str:
            return str(self.client().get_job_logs(sid))

        if status == "SUCCEEDED":  # its result lines are in the log: worth the wait
            return str(self._call(what, read, job=sid))
        try:
            return str(self._call(what, read, job=sid, tolerance_s=FAILED_LOGS_S))
        except Exception as exc:
            self.log.warning(
                f"the logs of Ray job {sid} ({status}) cannot be read "
                f"({type(exc).__name__}: {short_error(exc)}); what was streamed stands"
            )
            return None

    def run(
        self,
        request: JobRequest,
        *,
        archive: bytes | None = None,
        runtime: RuntimeArchive | None = None,
        requirements: list[str],
        metadata: dict[str, str],
    ) -> JobOutcome:
        """Submit (or re-attach to) the request's job and follow it to its end. Ray
        fetches the archive and the runtime (``py_modules``) from storage itself."""
        job, attached = self.submit_or_attach(
            request, requirements=requirements, metadata=metadata, archive=archive
        )
        return self.wait(job, attached=attached)
