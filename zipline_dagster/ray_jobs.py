"""Run one training request as a Ray Job and follow it to a terminal state.

Plain library code (no Dagster): the Dagster resource in ``resources.py`` wraps it.

* Submission ids are deterministic, ``zd-{model}-{version}-{ds}-{attempt}``: a retried or
  restarted step re-attaches to a live job for the same (model, version, ds) instead of
  starting a second one.
* The job's logs are forwarded line by line while it runs.
* An interrupt (run cancelled, even twice) or the timeout stops the Ray job before the
  step ends.
* Nothing secret goes into ``runtime_env`` or job metadata (both are shown verbatim by
  the dashboard); jobs inherit secrets from the cluster's own environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from zipline_dagster.training import JobOutcome, TrainingJobError, TrainingRequest, traceback_tail

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
LIVE = frozenset({"PENDING", "RUNNING"})
_MAX_ATTEMPT_PROBE = 1000


class RayJobError(TrainingJobError):
    """The Ray job failed, was stopped or timed out; carries the job id and log tail."""


class RayUnreachableError(RuntimeError):
    """No Ray cluster answers at the configured address, or its Ray version differs."""


def _http_address(address: str) -> str:
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    if address.startswith("ray://"):
        raise RayUnreachableError(
            f"Ray address {address!r} is a Ray Client address; the Job API needs the dashboard "
            "address, e.g. http://head:8265 (set RAY_ADDRESS or the resource's address)"
        )
    return f"http://{address.rstrip('/')}"


def cluster_ray_version(address: str, timeout: float = 5.0) -> str:
    url = f"{_http_address(address)}/api/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return str(json.load(r)["ray_version"])
    except Exception as exc:
        raise RayUnreachableError(
            f"no Ray cluster answers at {_http_address(address)} ({type(exc).__name__}: {exc}). "
            "Start the embedded head with `zipline-dagster ray up`, or point RAY_ADDRESS / the "
            "ray resource's address at a running cluster's dashboard (http://head:8265)."
        ) from None


def _is_not_found(exc: Exception) -> bool:
    text = str(exc)
    return "404" in text or "does not exist" in text or "not found" in text.lower()


class RayJobRunner:
    """Submit a training request as a Ray Job and wait for it.

    Args:
        address: the cluster's dashboard address (``http://host:8265``).
        auth_mode: ``RAY_AUTH_MODE`` for this client (``disabled`` or ``token``).
        timeout_s: stop the job and fail after this long.
        poll_max_s: longest wait between status checks (polling backs off up to it).
        install_requirements: install the trainer's ``install_requires`` into the job's
            environment (Ray's ``pip`` runtime env, cached per requirement set).
        log: receives the job's log lines and lifecycle messages.
    """

    def __init__(
        self,
        *,
        address: str,
        auth_mode: str | None = None,
        timeout_s: float = 6 * 3600,
        poll_max_s: float = 2.0,
        install_requirements: bool = True,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise TypeError(f"address must be a non-empty string, got {address!r}")
        self.address = _http_address(address)
        self.auth_mode = auth_mode
        self.timeout_s = timeout_s
        self.poll_max_s = poll_max_s
        self.install_requirements = install_requirements
        self.log = log or logging.getLogger(__name__)
        self._client: Any = None

    # -- connection -----------------------------------------------------------------
    def client(self) -> Any:
        if self._client is None:
            import ray
            from ray.job_submission import JobSubmissionClient

            if self.auth_mode:
                os.environ["RAY_AUTH_MODE"] = self.auth_mode
            version = cluster_ray_version(self.address)
            if version != ray.__version__:
                raise RayUnreachableError(
                    f"Ray version mismatch: the cluster at {self.address} runs Ray {version}, this "
                    f"client has Ray {ray.__version__}; install ray=={version} here or run a "
                    f"{ray.__version__} cluster"
                )
            try:
                self._client = JobSubmissionClient(self.address)
            except Exception as exc:
                raise RayUnreachableError(
                    f"cannot use the Ray Job API at {self.address}: {exc}"
                ) from None
        return self._client

    # -- ids and re-attachment ---------------------------------------------------------
    def _info(self, submission_id: str) -> Any | None:
        try:
            return self.client().get_job_info(submission_id)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise

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
    def runtime_env(self, request: TrainingRequest, requirements: list[str]) -> dict[str, Any]:
        env: dict[str, Any] = {
            "working_dir": request.archive_uri,
            # Platform settings only: runtime_env is shown verbatim by the dashboard.
            "env_vars": {"PYTHONUNBUFFERED": "1", **request.env},
        }
        if requirements and self.install_requirements:
            env["pip"] = {"packages": requirements, "pip_check": False}
        return env

    def submit_or_attach(
        self,
        request: TrainingRequest,
        *,
        requirements: list[str],
        metadata: dict[str, str],
        before_submit: Callable[[], None] | None = None,
    ) -> tuple[str, bool]:
        """Re-attach to a live job for the same (model, version, ds), else submit one."""
        attempt, info = self.find_attempt(request.job_key)
        if info is not None and str(info.status) in LIVE:
            sid = f"zd-{request.job_key}-{attempt}"
            self.log.info(
                f"re-attaching to live Ray job {sid} ({info.status}) instead of submitting again"
            )
            return sid, True
        if before_submit:
            before_submit()
        sid = f"zd-{request.job_key}-{attempt + 1}"
        resources = request.model.training_conf.resource_config
        try:
            self.client().submit_job(
                entrypoint=request.entrypoint,
                submission_id=sid,
                runtime_env=self.runtime_env(request, requirements),
                metadata=metadata,
                # A distributed driver holds no CPU its own workers need.
                entrypoint_num_cpus=resources.cpus_per_replica if resources.workers == 0 else 0,
            )
        except Exception as exc:
            if "already exists" in str(exc):  # another step submitted it a moment ago
                self.log.info(f"Ray job {sid} was just submitted by another step; re-attaching")
                return sid, True
            raise
        self.log.info(f"submitted Ray job {sid}: {request.entrypoint}")
        return sid, False

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
                self.log.warning(f"could not stop Ray job {submission_id}: {exc}")
                break
        self.log.warning(f"Ray job {submission_id} stop requested; status {status}")
        return status

    def wait(self, submission_id: str, *, started: float, attached: bool) -> JobOutcome:
        client = self.client()
        delay, sent = 0.2, 0
        logs = ""
        status = "PENDING"
        try:
            while True:
                status = str(client.get_job_status(submission_id))
                logs = client.get_job_logs(submission_id)
                if len(logs) > sent:
                    for line in logs[sent:].splitlines():
                        if line.strip():
                            self.log.info(f"[{submission_id}] {line}")
                    sent = len(logs)
                if status in TERMINAL:
                    break
                if time.monotonic() - started > self.timeout_s:
                    final = self.stop(submission_id)
                    raise RayJobError(
                        f"Ray job {submission_id} timed out after {self.timeout_s:.0f}s and was "
                        f"stopped ({final})",
                        job_id=submission_id,
                        logs_tail=traceback_tail(logs),
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, self.poll_max_s)
        except RayJobError:
            raise
        except BaseException:
            # Run cancelled (Dagster interrupts the step), or anything else: never leave
            # the job running behind a step that has ended.
            if status not in TERMINAL:
                self.stop(submission_id)
            raise
        outcome = JobOutcome(
            job_id=submission_id,
            status=status,
            dashboard_url=self.address,
            attached=attached,
            seconds=time.monotonic() - started,
            logs=logs,
        )
        if status != "SUCCEEDED":
            info = client.get_job_info(submission_id)
            error_type = getattr(info, "error_type", None)
            exit_code = getattr(info, "driver_exit_code", None)
            tail = traceback_tail(logs or (info.message or ""))
            message = (info.message or "").strip().splitlines()
            first = message[0] if message else ""
            raise RayJobError(
                f"Ray job {submission_id} {status}"
                + (
                    f" ({error_type}"
                    + (f", exit code {exit_code}" if exit_code is not None else "")
                    + ")"
                    if error_type
                    else ""
                )
                + f": {first}\n--- trainer output (tail) ---\n{tail}",
                job_id=submission_id,
                logs_tail=tail,
            )
        return outcome

    def run(
        self,
        request: TrainingRequest,
        *,
        archive: bytes | None = None,
        requirements: list[str],
        metadata: dict[str, str],
        before_submit: Callable[[], None] | None = None,
    ) -> JobOutcome:
        started = time.monotonic()
        sid, attached = self.submit_or_attach(
            request, requirements=requirements, metadata=metadata, before_submit=before_submit
        )
        return self.wait(sid, started=started, attached=attached)


_SAFE_META = re.compile(r"^[\w.:/@+-]{0,256}$")


def job_metadata(**values: str) -> dict[str, str]:
    """Job metadata is public (dashboard, list_jobs): only plain identifiers go in."""
    out = {}
    for k, v in values.items():
        if not _SAFE_META.match(v):
            raise ValueError(f"job metadata {k}={v!r} is not a plain identifier")
        out[f"zipline.{k}"] = v
    return out
