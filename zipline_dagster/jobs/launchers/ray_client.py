"""Talking to a Ray cluster's dashboard (the Job API): its address, its Ray version, a
job submission client whose requests time out, and which errors say nothing about the
job itself (transient) or that it does not exist."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from zipline_dagster.jobs.request import TrainingJobError

#: longest wait for the dashboard's answer to one request (Ray's client sets none)
REQUEST_TIMEOUT_S = 30.0


class RayUnreachableError(RuntimeError):
    """No Ray cluster answers at the configured address, or its Ray version differs."""


def http_address(address: str) -> str:
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    if address.startswith("ray://"):
        raise RayUnreachableError(
            f"Ray address {address!r} is a Ray Client address; the Job API needs the dashboard "
            "address, e.g. http://head:8265 (set RAY_ADDRESS or the resource's address)"
        )
    return f"http://{address.rstrip('/')}"


def cluster_ray_version(address: str, timeout: float = 5.0) -> str:
    url = f"{http_address(address)}/api/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return str(json.load(r)["ray_version"])
    except Exception as exc:
        raise RayUnreachableError(
            f"no Ray cluster answers at {http_address(address)} ({type(exc).__name__}: {exc}). "
            "Start the embedded head with `zipline-dagster ray up`, or point RAY_ADDRESS / the "
            "ray resource's address at a running cluster's dashboard (http://head:8265)."
        ) from exc


def job_submission_client(address: str, request_timeout_s: float) -> Any:
    """Ray's ``JobSubmissionClient`` whose every request gives up after
    ``request_timeout_s`` without an answer (connecting: at most 10 s of it).

    Ray's client sends its requests with no timeout, so a dashboard that accepts a
    connection and never answers (a hung process, a stalled proxy) would hold the step
    until the run is cancelled, past ``timeout_s`` and the unreachable tolerance. With a
    timeout, that request fails as ``requests.Timeout``, which counts as the dashboard
    being unreachable. The log stream (a websocket) is not affected: it only ever makes
    the step learn sooner.
    """
    from ray.job_submission import JobSubmissionClient

    timeout = (min(request_timeout_s, 10.0), request_timeout_s)

    class _TimedClient(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout)
            return super()._do_request(method, endpoint, **kwargs)

    return _TimedClient(address)


def is_not_found(exc: Exception) -> bool:
    text = str(exc)
    return "404" in text or "does not exist" in text or "not found" in text.lower()


class RayDashboardLostError(TrainingJobError):
    """The dashboard stayed unreachable longer than the tolerance; the job may still run."""


def is_transient(exc: BaseException) -> bool:
    """An error talking to the dashboard that says nothing about the job itself.

    Connection refused / reset / remote disconnected, timeouts, and 5xx answers (a proxy
    in front of the dashboard answers 502 while it restarts).
    """
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return True
    text = str(exc)
    if "already exists" in text or "does not exist" in text:
        return False  # the dashboard answered about the job itself
    return bool(re.search(r"status code 5\d\d", text)) or "Connection aborted" in text


def short_error(exc: BaseException, limit: int = 200) -> str:
    """An error's text on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


_SAFE_META = re.compile(r"^[\w.:/@+-]{0,256}$")


def job_metadata(**values: str) -> dict[str, str]:
    """Job metadata is public (dashboard, list_jobs): only plain identifiers go in."""
    out = {}
    for k, v in values.items():
        if not _SAFE_META.match(v):
            raise ValueError(f"job metadata {k}={v!r} is not a plain identifier")
        out[f"zipline.{k}"] = v
    return out
