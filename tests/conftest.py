"""Shared fixtures: real services on loopback, started by the tests and stopped after them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanup import register, unregister

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "trainers"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """A real S3 API server (moto in server mode) on loopback, with test credentials.

    Yields the environment a client needs (endpoint + credentials); tests that want the
    standard AWS environment use the ``s3_env`` fixture.
    """
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    register(proc.pid, group=False, what="moto S3 server")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint + "/moto-api/")
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        unregister(proc.pid)


@pytest.fixture
def s3_env(s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> str:
    """A fresh bucket on the loopback S3 server; returns ``s3://name``."""
    import uuid

    from zipline_dagster.storage.blobs import default_s3_client

    name = f"test-{uuid.uuid4().hex[:12]}"
    default_s3_client().create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def trainer_copy(tmp_path: Path) -> Path:
    """A private copy of the reference trainer package (tests may modify it)."""
    dst = tmp_path / "listing_ctr_model"
    shutil.copytree(
        TRAINERS / "listing_ctr_model", dst, ignore=shutil.ignore_patterns("__pycache__")
    )
    return dst


@pytest.fixture
def file_base(tmp_path: Path) -> str:
    base = tmp_path / "warehouse"
    base.mkdir()
    return base.as_uri()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "zipline-dagster"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


FIXTURE_TRAINERS = Path(__file__).resolve().parent / "fixtures" / "trainers"


@pytest.fixture(scope="session")
def ray_head(s3_server: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real local Ray head (its own process group and ports), stopped after the session.

    It is started with the loopback S3 server's endpoint and credentials in its
    environment: Ray's runtime-env agent fetches s3:// working_dirs with them, and jobs
    inherit them (never through runtime_env).
    """
    from zipline_dagster.training.launchers.ray_head import LocalRayHead

    head = LocalRayHead(tmp_path_factory.mktemp("ray"), num_cpus=2, env=dict(s3_server))
    info = head.ensure_running()
    register(info.pid, group=True, what="Ray head")
    try:
        yield info
    finally:
        head.stop()
        unregister(info.pid)


@pytest.fixture(scope="session")
def spark_resource() -> Iterator[Any]:
    """A real local Spark session (local[2]), shared by the session's tests."""
    from zipline_dagster.features.spark import SparkResource

    res = SparkResource(master="local[2]")
    yield res
    res.spark_session.stop()


@pytest.fixture(params=["ray", "local"])
def launcher(request: pytest.FixtureRequest) -> str | None:
    """The same model-asset tests run on both launchers: a Ray address, or None for local."""
    if request.param == "ray":
        request.applymarker(pytest.mark.ray)
        return str(request.getfixturevalue("ray_head").dashboard_url)
    return None


@pytest.fixture(scope="module")
def ray_two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real two-node Ray cluster on this machine: a head and a second `ray start
    --address` node (each 2 CPUs), both in their own process groups, stopped after."""
    import signal

    from zipline_dagster.training.launchers.ray_head import LocalRayHead

    head = LocalRayHead(tmp_path_factory.mktemp("ray2"), num_cpus=2)
    info = head.ensure_running()
    register(info.pid, group=True, what="Ray head (two-node cluster)")
    log = open(tmp_path_factory.mktemp("ray2node") / "node.log", "wb")  # noqa: SIM115
    node = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--block",
            f"--address={info.gcs_address}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
        ],
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    register(node.pid, group=True, what="Ray worker node")
    try:
        deadline = time.monotonic() + 90
        while True:
            with urllib.request.urlopen(f"{info.dashboard_url}/nodes?view=summary", timeout=5) as r:
                import json

                summary = json.load(r)["data"]["summary"]
            alive = [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]
            if len(alive) >= 2:
                break
            assert time.monotonic() < deadline, f"second node did not join: {summary}"
            time.sleep(1)
        yield info
    finally:
        try:
            os.killpg(node.pid, signal.SIGTERM)
            node.wait(8)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        head.stop()
        unregister(node.pid)
        unregister(info.pid)
