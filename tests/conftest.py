"""Shared fixtures: real services on loopback, started by the tests and stopped after them."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import xdist_scheduler
from tests.cleanup import register, unregister

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "trainers"
BIN = Path(sys.executable).parent


# `make test` runs two pytest-xdist workers, each given whole modules, the longest first
pytest_xdist_make_scheduler = xdist_scheduler.pytest_xdist_make_scheduler


#: Fixtures that start a service: a Ray head, a loopback storage server, a Spark session,
#: an MLflow server, `dagster dev`, the production topology.
SERVICE_FIXTURES = frozenset(
    {
        "s3_server",
        "gcs_server",
        "azurite_server",
        "ray_head",
        "ray_two_nodes",
        "spark_resource",
        "mlflow_server",
        "dagster_dev",
        "topology",
        "other_version_dashboard",
    }
)
#: Parameter values that make a test fetch a service fixture itself
#: (``request.getfixturevalue``): a Ray launcher, an object store's server.
SERVICE_PARAMS = frozenset({"ray", "s3", "gs", "abfss"})
#: Markers of tests that need a service.
SERVICE_MARKERS = ("ray", "spark", "s3", "cluster", "ui")
#: Modules whose tests start a service themselves (a Ray head, `dagster dev`, the demo).
SERVICE_MODULES = frozenset(
    {
        "tests/defs/test_first_model.py",
        "tests/jobs/launchers/test_ray_head.py",
        "tests/test_dev.py",
        "tests/test_cli.py",
    }
)


def starts_a_service(item: pytest.Item) -> bool:
    """Whether ``item`` needs a service started: it uses a fixture that starts one, is a
    parameter case that fetches one (the ``launcher`` fixture's Ray case, an object
    store's), carries a service marker, or is in a module whose tests start one
    themselves."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return bool(
        SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        or SERVICE_PARAMS & {v for v in params.values() if isinstance(v, str)}
        or any(item.get_closest_marker(m) for m in SERVICE_MARKERS)
        or item.nodeid.split("::")[0] in SERVICE_MODULES
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `make test-fast` runs what starts no service and is not slow
    for item in items:
        if starts_a_service(item):
            item.add_marker(pytest.mark.service)
    xdist_scheduler.order(items)


_DAGSTER_HOME = pytest.StashKey[tuple[str | None, Path]]()
_INSTALL = pytest.StashKey[str | None]()
INSTALL_REQUIREMENTS = "ZIPLINE_RAY_INSTALL_REQUIREMENTS"
_SUBMIT_OPTS = pytest.StashKey[str | None]()
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
C1_ONLY = "-XX:TieredStopAtLevel=1"


def pytest_configure(config: pytest.Config) -> None:
    """Each test process gets its own Dagster instance folder as ``DAGSTER_HOME``: the
    make targets export the project's ``.dagster_home`` (the demo's, absent on a clean
    clone), which no test may read or write."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="zd-test-dagster-home-"))
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    config.stash[_DAGSTER_HOME] = (os.environ.get("DAGSTER_HOME"), home)
    os.environ["DAGSTER_HOME"] = str(home)
    # The tests' Ray jobs run in the tests' own environment, which holds every trainer's
    # requirements (compiled), as an image would: Ray's pip env is a clone of that whole
    # environment per requirement set and per head, tens of CPU-seconds each. The tests
    # about the pip env turn it on themselves (test_fanout's pool test; test_request
    # checks the runtime_env).
    config.stash[_INSTALL] = os.environ.get(INSTALL_REQUIREMENTS)
    os.environ.setdefault(INSTALL_REQUIREMENTS, "false")
    # The test run's Spark JVMs (its own sessions and every process it starts: the CLI,
    # runs, the demo) compile with C1 only, through Spark's own SPARK_SUBMIT_OPTS: on the
    # tests' few thousand rows a day C2's compiling is much of each JVM's CPU. Not the
    # product's default: on large days a C1-only JVM is slower (b0a78b4's message has
    # the measurements).
    # (once: an xdist worker inherits the controller's environment, already set)
    config.stash[_SUBMIT_OPTS] = os.environ.get(SUBMIT_OPTS)
    opts = os.environ.get(SUBMIT_OPTS, "").split()
    os.environ[SUBMIT_OPTS] = " ".join(opts if C1_ONLY in opts else [*opts, C1_ONLY])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DAGSTER_HOME not in config.stash:
        return
    before, home = config.stash[_DAGSTER_HOME]
    shutil.rmtree(home, ignore_errors=True)
    for name, value in (
        ("DAGSTER_HOME", before),
        (INSTALL_REQUIREMENTS, config.stash[_INSTALL]),
        (SUBMIT_OPTS, config.stash[_SUBMIT_OPTS]),
    ):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def free_port() -> int:
    from zipline_dagster.processes import free_ports

    return free_ports(1)[0]


def wait_http(url: str, timeout: float = 30.0, *, any_status: bool = False) -> None:
    """Wait until ``url`` answers 2xx (or, with ``any_status``, answers at all)."""
    import urllib.error

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError as exc:
            if any_status:
                return
            last = exc
            time.sleep(0.2)
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")


@contextlib.contextmanager
def moto_server(recording: Path) -> Iterator[dict[str, str]]:
    """A real S3 API server (moto in server mode) on loopback, with test credentials,
    stopped when the block ends. Yields the environment a client needs (endpoint and
    credentials). The server records the requests it gets while a test asks it to
    (``tests.helpers.s3_requests``), in ``recording``."""
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_RECORDER_FILEPATH": str(recording)},
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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The session's S3 server (``moto_server``); tests that want the standard AWS
    environment use the ``s3_env`` fixture."""
    with moto_server(tmp_path_factory.mktemp("moto") / "recording.jsonl") as env:
        yield env


def _setenv(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> dict[str, str]:
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _fresh_bucket(scheme: str, env: dict[str, str]) -> str:
    """A new bucket (container) on the loopback server ``env`` points at; its name."""
    import uuid

    from zipline_dagster.settings import StorageOptions
    from zipline_dagster.storage.object_store import object_filesystem

    name = f"test-{uuid.uuid4().hex[:12]}"
    opts = StorageOptions(
        s3_endpoint_url=env.get("AWS_ENDPOINT_URL"),
        gcs_endpoint_url=env.get("STORAGE_EMULATOR_HOST"),
        azure_connection_string=env.get("AZURE_STORAGE_CONNECTION_STRING"),
    )
    object_filesystem(scheme, opts).mkdir(name)
    return name


@pytest.fixture
def s3_env(s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return _setenv(monkeypatch, s3_server)


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> str:
    """A fresh bucket on the loopback S3 server; returns ``s3://name``."""
    return f"s3://{_fresh_bucket('s3', s3_env)}"


def _serve(cmd: list[str], *, what: str, url: str, cwd: Path | None = None) -> Any:
    """Start a loopback server in its own session, recorded for cleanup; wait for ``url``."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        start_new_session=True,
    )
    register(proc.pid, group=True, what=what)
    try:
        wait_http(url, any_status=True)
    except BaseException:
        _stop(proc)
        raise
    return proc


#: How long a test service gets to stop on SIGTERM before its group is killed: the
#: servers hold nothing the tests need afterwards, and some never exit on their own
#: (Azurite says it closed, then its process lingers; a Ray head's group takes longer).
GRACE_S = 2.0


def _stop(proc: Any) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass
    unregister(proc.pid)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[dict[str, str]]:
    """A real GCS API server on loopback (``gcp-storage-emulator`` from PyPI, in memory).

    Yields the environment the Google SDKs use to reach it (``STORAGE_EMULATOR_HOST``).
    """
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve(
        [
            str(BIN / "gcp-storage-emulator"),
            "start",
            "--host=127.0.0.1",
            f"--port={port}",
            "--in-memory",
        ],
        what="GCS emulator",
        url=endpoint + "/storage/v1/b",
    )
    try:
        yield {"STORAGE_EMULATOR_HOST": endpoint}
    finally:
        _stop(proc)


#: Azurite's documented development account (public, fixed; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_BIN = ROOT / ".tools" / "node" / "node_modules" / ".bin" / "azurite-blob"


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real Azure Blob API server on loopback (Azurite from npm, installed by ``make test``).

    Yields the environment the Azure SDKs use to reach it
    (``AZURE_STORAGE_CONNECTION_STRING``).
    """
    if not AZURITE_BIN.exists():
        pytest.fail(f"Azurite is not installed at {AZURITE_BIN}: run the tests with `make test`")
    port = free_port()
    blob = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    proc = _serve(
        [
            str(AZURITE_BIN),
            "--blobHost=127.0.0.1",
            f"--blobPort={port}",
            f"--location={tmp_path_factory.mktemp('azurite')}",
            "--silent",
            "--loose",
            "--skipApiVersionCheck",
            # no telemetry: it kept an idle Azurite at 1-2% of a core (none without it)
            "--disableTelemetry",
        ],
        what="Azurite",
        url=f"{blob}?comp=list",
    )
    try:
        yield {
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={blob};"
            )
        }
    finally:
        _stop(proc)


@pytest.fixture
def gcs_env(gcs_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return _setenv(monkeypatch, gcs_server)


@pytest.fixture
def azure_env(azurite_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return _setenv(monkeypatch, azurite_server)


@pytest.fixture
def gs_bucket(gcs_env: dict[str, str]) -> str:
    """A fresh bucket on the loopback GCS server; returns ``gs://name``."""
    return f"gs://{_fresh_bucket('gs', gcs_env)}"


@pytest.fixture
def abfss_container(azure_env: dict[str, str]) -> str:
    """A fresh container on Azurite; returns ``abfss://name@account.dfs.core.windows.net``
    (the production URI form; the connection string routes it to Azurite)."""
    return f"abfss://{_fresh_bucket('abfss', azure_env)}@{AZURITE_ACCOUNT}.dfs.core.windows.net"


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
def ray_head(
    s3_server: dict[str, str],
    gcs_server: dict[str, str],
    azurite_server: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """A real local Ray head (its own process group and ports), stopped after the session.

    It is started with the loopback storage servers' endpoints and credentials in its
    environment, as a cluster is: Ray's runtime-env agent fetches s3:// and gs://
    working_dirs with them, and jobs inherit them (never through runtime_env).
    """
    # PYTHONDONTWRITEBYTECODE as many images (and this machine) set it: jobs must still
    # get their bytecode into Ray's pip env (see test_fanout)
    env = {**s3_server, **gcs_server, **azurite_server, "PYTHONDONTWRITEBYTECODE": "1"}
    # no log monitor (1% of a core for the session): no test on this head reads what a
    # job's tasks print from the job's log (the range driver returns their output with
    # their results); the Ray Train test has its own cluster (``ray_two_nodes``)
    yield from running_head(tmp_path_factory.mktemp("ray"), "Ray head", env=env, log_monitor=False)


def running_head(
    state_dir: Path, what: str, *, env: dict[str, str] | None = None, log_monitor: bool = True
) -> Iterator[Any]:
    """A local Ray head (2 CPUs) in ``state_dir``, recorded for cleanup while it runs;
    yields its HeadInfo and stops it afterwards (for fixtures: ``yield from``)."""
    from zipline_dagster.jobs.launchers.ray_head import LocalRayHead

    head = LocalRayHead(state_dir, num_cpus=2, env=env, log_monitor=log_monitor)
    info = head.ensure_running()
    register(info.pid, group=True, what=what)
    try:
        yield info
    finally:
        head.stop(timeout=GRACE_S)
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

    from zipline_dagster.jobs.launchers.ray_head import LocalRayHead

    head = LocalRayHead(tmp_path_factory.mktemp("ray2"), num_cpus=2)
    info = head.ensure_running()
    register(info.pid, group=True, what="Ray head (two-node cluster)")
    node_dir = tmp_path_factory.mktemp("ray2node")
    log = open(node_dir / "node.log", "wb")  # noqa: SIM115
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
        env={
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "TMPDIR": str(node_dir),  # a killed node's pymp-* folder stays out of /tmp
        },
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
            node.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        head.stop(timeout=GRACE_S)
        unregister(node.pid)
        unregister(info.pid)
