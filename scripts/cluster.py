"""The production topology on this machine, on loopback: ``make cluster-up`` and
``make cluster-down`` (``python scripts/cluster.py up | down | status | env | stop S |
start S``).

Each service is its own process (group), started here and recorded in
``.zipline/cluster/state.json`` (``ZIPLINE_CLUSTER_DIR`` moves it) with its PID and
start time, so that ``down`` stops exactly what ``up`` started and nothing else:

* ``postgres``: Debian's PostgreSQL server (``scripts/system-deps postgres``), its own
  data folder; the Dagster instance's run, event log and schedule storage
  (``dagster-postgres``). Its password is generated into ``secrets/`` (mode 600) and
  reaches Dagster through ``ZIPLINE_PG_PASSWORD``, never a file Dagster shows;
* ``s3``: moto's S3 server, for trainer archives and model artifacts;
* ``ray-head`` with no CPUs (it runs no training), ``ray-worker-1`` and ``ray-worker-2``
  with one CPU and one ``zipline_worker`` resource each: job drivers ask for a sliver of
  it (``ZIPLINE_RAY_ENTRYPOINT_RESOURCES``), so they land on the workers too;
* ``spark-master`` (``spark://127.0.0.1:7077``) and ``spark-worker``, from the pyspark
  distribution's own launch classes;
* ``dagster-daemon`` and ``dagster-webserver``, loading ``workspace.yaml``
  (``ZIPLINE_CLUSTER_WORKSPACE`` names another): runs go through a
  ``QueuedRunCoordinator``, each in its own process, a failed run is retried once (run
  retries, for a lost node or database), and model trainings share the
  ``zipline_training`` concurrency pool (limit ``TRAINING_POOL_LIMIT``).

The warehouse tables stay on ``file://`` (a disk the Spark workers share): this Spark has
no ``s3a`` connector jars and no Maven repository is reachable to fetch them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from zipline_dagster.processes import (  # noqa: E402
    ProcessIdentity,
    descendants,
    free_ports,
    group_alive,
    terminate,
)

TRAINING_POOL = "zipline_training"
TRAINING_POOL_LIMIT = 2
#: how often the daemon's backfill, automation and run-queue passes run (seconds): a
#: backfill's next runs start within this of the last ones ending (Dagster's default: 30)
DAEMON_INTERVAL_S = 5
BUCKET = "zipline-cluster"
PG_USER, PG_DB = "zipline", "dagster"
#: the warehouse's Iceberg catalog: a database of its own on the same server
CATALOG_DB = "iceberg_catalog"
#: ``up`` starts these together, wave after wave: what depends on nothing; a Ray and the
#: Spark worker (on their head and master) and Dagster's daemon (on Postgres, whose schema
#: it creates, and S3, where the code location's trainer archives are); then the
#: webserver, once that schema exists, and the second Ray worker (two Ray nodes started
#: at once on one machine: one of them never joined)
START_WAVES = (
    ("postgres", "s3", "ray-head", "spark-master"),
    ("ray-worker-1", "spark-worker", "dagster-daemon"),
    ("ray-worker-2", "dagster-webserver"),
)
SERVICES = tuple(name for wave in START_WAVES for name in wave)

#: ``down`` stops these together, wave after wave: Dagster (every other service's
#: client), then the workers, then what they hang on
STOP_WAVES = (
    ("dagster-webserver", "dagster-daemon"),
    ("spark-worker", "ray-worker-1", "ray-worker-2", "s3"),
    ("spark-master", "ray-head", "postgres"),
)
assert sorted(n for wave in STOP_WAVES for n in wave) == sorted(SERVICES)


class ClusterError(RuntimeError):
    """The topology cannot start, or is in a state this command refuses to act on."""


def cluster_dir() -> Path:
    return Path(os.environ.get("ZIPLINE_CLUSTER_DIR") or ROOT / ".zipline" / "cluster")


def workspace() -> str:
    """The workspace file the daemon and the webserver load."""
    return os.environ.get("ZIPLINE_CLUSTER_WORKSPACE") or str(ROOT / "workspace.yaml")


def free_port(preferred: int | None = None, *, avoid: Iterable[int] = ()) -> int:
    """``preferred`` if it is free, else a free port that is none of ``avoid`` (the
    ports given to services that may not listen yet: they start in parallel)."""
    if preferred:
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", preferred))
            return preferred
    return free_ports(1, avoid=avoid)[0]


class Cluster:
    """The state file and the services it records."""

    def __init__(self, folder: Path | None = None) -> None:
        self.dir = (folder or cluster_dir()).resolve()
        self.state_file = self.dir / "state.json"
        self.state: dict[str, Any] = self._read()
        self._saving = threading.Lock()

    # -- state ----------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (FileNotFoundError, ValueError):
            return {"services": {}, "ports": {}}

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.state_file)

    def identity(self, name: str) -> ProcessIdentity | None:
        rec = self.state["services"].get(name)
        return ProcessIdentity(int(rec["pid"]), str(rec["start"])) if rec else None

    def running(self) -> list[str]:
        return [n for n in SERVICES if (i := self.identity(n)) is not None and i.alive()]

    @property
    def ports(self) -> dict[str, int]:
        return self.state["ports"]  # type: ignore[no-any-return]

    def port(self, name: str, preferred: int | None = None) -> int:
        """The port recorded for ``name`` (``up`` records them all), else a new free one."""
        if name not in self.ports:
            self.ports[name] = free_port(preferred, avoid=self.ports.values())
        return self.ports[name]

    def password(self) -> str:
        return (self.dir / "secrets" / "pg_password").read_text().strip()

    # -- what the deployment sees ---------------------------------------------------
    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['webserver']}"

    @property
    def spark_master(self) -> str:
        return f"spark://127.0.0.1:{self.ports['spark']}"

    @property
    def pg_dir(self) -> Path:
        """PostgreSQL's folder: the deployment's, unless the server's user (Debian's
        ``postgres``, when this runs as root) cannot reach it (a checkout in a mode-700
        home, as root's is): then a folder of its own under the system's temp folder,
        named after the deployment's."""
        mine = self.dir / "postgres"
        if os.geteuid() != 0 or _others_can_reach(self.dir):
            return mine
        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"zipline-postgres-{digest}"

    @property
    def dsn(self) -> str:
        """The Postgres DSN, without its password."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.ports['postgres']}/{PG_DB}"

    def env(self, *, secret: bool = True) -> dict[str, str]:
        """The environment of every process of the deployment (and of a client of it).
        ``secret``: with the Postgres password (never printed)."""
        env = {
            "DAGSTER_HOME": str(self.dir / "dagster_home"),
            "ZIPLINE_HOME": str(self.dir / "zipline"),
            "ZIPLINE_WAREHOUSE": (self.dir / "zipline" / "warehouse").as_uri(),
            "ZIPLINE_ARTIFACT_BASE": f"s3://{BUCKET}/artifacts",
            "RAY_ADDRESS": f"http://127.0.0.1:{self.ports['ray_dashboard']}",
            "RAY_AUTH_MODE": "disabled",
            "ZIPLINE_RAY_ENTRYPOINT_RESOURCES": json.dumps({"zipline_worker": 0.001}),
            # The nodes share this machine's disk, so Ray's session folder: a pip runtime
            # env built there by two nodes at once collides, and this environment already
            # holds the trainer's requirements (as a cluster's image would).
            "ZIPLINE_RAY_INSTALL_REQUIREMENTS": "false",
            # snapshots expire and manifests compact daily (champions' snapshots kept)
            "ZIPLINE_WAREHOUSE_MAINTENANCE": "on",
            "SPARK_MASTER": self.spark_master,
            # each application (one per Dagster run) takes one core of the worker, so two
            # runs' Spark jobs go on at once instead of queueing for all of them
            "SPARK_CONF_DIR": str(self.dir / "spark-conf"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": str(BIN / "python"),
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.ports['s3']}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",  # moto's; a real deployment's role
            "AWS_REGION": "us-east-1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if secret:
            env["ZIPLINE_PG_PASSWORD"] = self.password()
            # the tables' pyiceberg catalog (a secret: Dagster shows it as the variable)
            env["ZIPLINE_CATALOG_URI"] = (
                f"postgresql+psycopg2://{PG_USER}:{self.password()}@127.0.0.1:"
                f"{self.ports['postgres']}/{CATALOG_DB}"
            )
        return env

    # -- processes --------------------------------------------------------------------
    def _log_path(self, name: str) -> Path:
        """Where the service ``name`` logs (appended to across restarts)."""
        return self.dir / "logs" / f"{name}.log"

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        path = self._log_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=ROOT,
                start_new_session=True,
            )
        identity = ProcessIdentity.of(proc.pid)
        with self._saving:  # the services of a wave start at once
            self.state["services"][name] = {**identity.as_dict(), "argv": argv[:3]}
            self._save()
        _register(proc.pid, name)

    def stop(self, name: str) -> bool:
        stopped = self._terminate(name)
        self.state["services"].pop(name, None)
        self._save()
        return stopped

    def _terminate(self, name: str) -> bool:
        """Stop the service's process group (the state file is left to the caller)."""
        identity = self.identity(name)
        if identity is None:
            return False
        # a Ray head's group outlasts a long SIGTERM wait (its GCS, raylet and autoscaler
        # monitor wait on each other) and keeps nothing a restart would read
        stopped = terminate(identity, group=True, timeout=5 if name == "ray-head" else 15)
        if not stopped and group_alive(identity.pid):
            # its leader was killed (``kill --process``); what it started is still going
            # (a dead leader's group id is never reused while the group lives)
            os.killpg(identity.pid, signal.SIGKILL)
            stopped = True
        _unregister(identity.pid)
        return stopped

    def kill(self, name: str, *, group: bool = True) -> None:
        """``kill -9`` of the service as its machine's death would end it: its process
        group and every process it started, wherever they went (a Ray node's workers, and
        a job's driver below them, each run in a session of their own: a pod's death ends
        them with their node); or of its process alone (``group=False``: what it started
        goes on, as a deployment's runs outlive its daemon). A fault, for the tests;
        ``start`` brings the service back."""
        identity = self.identity(name)
        if identity is None or not identity.alive():
            raise ClusterError(f"{name} is not running")
        if not group:
            os.kill(identity.pid, signal.SIGKILL)
        else:
            started = descendants(identity.pid)  # found first: then they belong to init
            os.killpg(identity.pid, signal.SIGKILL)
            for process in started:
                with contextlib.suppress(ProcessLookupError):
                    if process.alive():  # not a PID since reused
                        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while identity.alive() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):  # reaped, when it is our child
                os.waitpid(identity.pid, os.WNOHANG)
            time.sleep(0.05)

    def _wait(self, name: str, ready: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            identity = self.identity(name)
            if identity is None or not identity.alive():
                raise ClusterError(f"{name} exited while starting; {self._tail(name)}")
            try:
                if ready():
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise ClusterError(f"{name} did not become ready in {timeout:.0f}s; {self._tail(name)}")

    def _tail(self, name: str) -> str:
        path = self._log_path(name)
        try:
            text = path.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            text = ""
        return f"its log {path} ends:\n{text}"

    # -- the services -------------------------------------------------------------------
    def start(self, name: str) -> None:
        if name == "ray-head":
            running = self.running()
            workers = [n for n in running if n.startswith("ray-worker")]
            if workers and name not in running:
                self._restart_ray_cluster(workers)
                return
        starts = {
            "postgres": self._start_postgres,
            "s3": self._start_s3,
            "ray-head": self._start_ray_head,
            "ray-worker-1": self._start_ray_worker,
            "ray-worker-2": self._start_ray_worker,
            "spark-master": self._start_spark_master,
            "spark-worker": self._start_spark_worker,
            "dagster-daemon": self._start_dagster_daemon,
            "dagster-webserver": self._start_dagster_webserver,
        }
        starts[name](name)

    def _start_postgres(self, name: str) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
        if not bins:
            raise ClusterError(
                "no PostgreSQL server: run scripts/system-deps postgres (Debian's postgresql)"
            )
        pg = bins[-1].parent
        data = self.pg_dir / "data"
        as_user = _as_postgres_user()
        secret_dir = self.dir / "secrets"
        if not (data / "PG_VERSION").exists():
            secret_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            password = secrets.token_urlsafe(18)
            (secret_dir / "pg_password").write_text(password)
            os.chmod(secret_dir / "pg_password", 0o600)
            data.mkdir(parents=True, exist_ok=True)
            pwfile = self.pg_dir / "initdb.pw"
            pwfile.write_text(password)
            _chown_postgres(self.pg_dir)
            try:
                subprocess.run(
                    [*as_user, str(pg / "initdb"), "-D", str(data), "-U", PG_USER,
                     "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8"],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
            except subprocess.CalledProcessError as exc:
                raise ClusterError(f"initdb failed: {exc.stderr[-1500:]}") from exc
            finally:
                pwfile.unlink(missing_ok=True)
        port = self.port("postgres")
        sockets = self.pg_dir / "run"
        sockets.mkdir(exist_ok=True)
        _chown_postgres(sockets)
        self._spawn(
            name,
            [*as_user, str(pg / "postgres"), "-D", str(data), "-p", str(port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sockets}"],
        )  # fmt: skip
        env = {**os.environ, "PGPASSWORD": self.password()}

        def has_db(db: str = PG_DB) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(pg / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, "-d",
                 "postgres", "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{db}'"],
                env=env, capture_output=True, text=True, timeout=10,
            )  # fmt: skip

        self._wait(name, lambda: has_db().returncode == 0)
        for db in (PG_DB, CATALOG_DB):  # Dagster's instance, the tables' catalog
            if has_db(db).stdout.strip() != "1":
                subprocess.run(
                    [str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, db],
                    env=env, check=True, capture_output=True, timeout=30,
                )  # fmt: skip

    def _start_s3(self, name: str) -> None:
        port = self.port("s3")
        # moto keeps its buckets in memory: a restart starts empty (so does ``up``)
        self._spawn(name, [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)])

        def ready() -> bool:
            import boto3

            s3 = boto3.client(
                "s3",
                endpoint_url=f"http://127.0.0.1:{port}",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
            )
            s3.create_bucket(Bucket=BUCKET)
            return True

        self._wait(name, ready)

    def _ray_env(self) -> dict[str, str]:
        from zipline_dagster.jobs.launchers.ray_head import EMBEDDED_HEAD_ENV

        env = {**EMBEDDED_HEAD_ENV, **self.env(secret=False), "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS")
        # its processes' temporary files (a killed dashboard's pymp-* folder) go where
        # `down` removes them
        self.ray_temp.mkdir(parents=True, exist_ok=True)
        return {**env, "TMPDIR": str(self.ray_temp)}

    def _restart_ray_cluster(self, workers: list[str]) -> None:
        """The head started again while its worker nodes outlived it (a rescheduled head
        pod): they hang on the dead head's GCS, and their session makes ``ray start
        --head`` refuse ("already running"). They stop, the head starts, and they start
        again and join it, so the cluster comes back whole."""
        for worker in workers:
            self._terminate(worker)
            self.state["services"].pop(worker, None)
        self._save()
        self._start_ray_head("ray-head")
        for worker in workers:
            self._start_ray_worker(worker)

    def _start_ray_head(self, name: str) -> None:
        ports = self.ports
        # all four at once: picked one at a time, two could be the same port
        gcs, dashboard, client, agent = free_ports(4, avoid=ports.values())
        ports.setdefault("ray_gcs", gcs)
        ports.setdefault("ray_dashboard", dashboard)
        self._spawn(
            name,
            [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=0",
             "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
             f"--port={ports['ray_gcs']}", f"--dashboard-port={ports['ray_dashboard']}",
             f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
             f"--temp-dir={self.ray_temp}", "--disable-usage-stats"],
            env=self._ray_env(),
        )  # fmt: skip
        url = f"http://127.0.0.1:{ports['ray_dashboard']}/api/version"
        self._wait(name, lambda: urllib.request.urlopen(url, timeout=2).status == 200)

    @property
    def ray_temp(self) -> Path:
        """Ray's session root (socket paths must stay short)."""
        import hashlib
        import tempfile

        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"zd-cluster-{digest}"

    def _start_ray_worker(self, name: str) -> None:
        self._spawn(
            name,
            [str(BIN / "ray"), "start", "--block", f"--address=127.0.0.1:{self.ports['ray_gcs']}",
             "--node-ip-address=127.0.0.1", "--num-cpus=1",
             '--resources={"zipline_worker": 1}', f"--labels=zipline-service={name}",
             f"--dashboard-agent-listen-port={free_port(avoid=self.ports.values())}",
             "--disable-usage-stats"],
            env=self._ray_env(),
        )  # fmt: skip
        want = 1 + sum(1 for n in self.running() if n.startswith("ray-worker"))
        self._wait(name, lambda: len(self.ray_nodes()) >= want)

    def ray_nodes(self) -> list[dict[str, Any]]:
        """The alive Ray nodes (the dashboard's node summary)."""
        url = f"http://127.0.0.1:{self.ports['ray_dashboard']}/nodes?view=summary"
        with urllib.request.urlopen(url, timeout=5) as r:
            summary = json.load(r)["data"]["summary"]
        return [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]

    def worker_of(self, node_id: str) -> str:
        """The service (``ray-worker-N``) whose node has this Ray node id."""
        from ray.util.state import list_nodes

        address = self.env(secret=False)["RAY_ADDRESS"]
        for node in list_nodes(address=address, limit=100, raise_on_missing_output=False):
            if node.node_id == node_id and node.labels.get("zipline-service"):
                return str(node.labels["zipline-service"])
        raise ClusterError(f"no worker service runs Ray node {node_id}")

    def _spark_class(self, name: str, main: str, *args: str) -> None:
        import pyspark

        home = Path(pyspark.__file__).parent
        env = {
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.dir / "logs"),
            "PYSPARK_PYTHON": str(BIN / "python"),
        }
        self._spawn(name, [str(home / "bin" / "spark-class"), main, *args], env=env)

    def _spark_conf(self) -> None:
        conf = self.dir / "spark-conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "spark-defaults.conf").write_text(
            "spark.cores.max 1\nspark.executor.cores 1\nspark.executor.memory 768m\n"
        )

    def _start_spark_master(self, name: str) -> None:
        self._spark_conf()
        port = self.port("spark", 7077)
        ui = self.port("spark_ui")
        self._spark_class(
            name, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
        )  # fmt: skip
        self._wait(name, lambda: _listening(port))

    def _start_spark_worker(self, name: str) -> None:
        ui = self.port("spark_worker_ui")
        log = self._log_path(name)
        since = log.stat().st_size if log.exists() else 0  # a restart appends to it
        self._spark_class(
            name, "org.apache.spark.deploy.worker.Worker", self.spark_master,
            "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(ui),
            "--work-dir", str(self.dir / "spark-work"),
        )  # fmt: skip

        def registered() -> bool:
            # the worker's own word that the master took it (the master's web UI may have
            # moved to the next port when another process took the one it was given)
            with open(log, "rb") as f:
                f.seek(since)
                return b"Successfully registered with master" in f.read()

        self._wait(name, registered)

    def _dagster_home(self) -> None:
        home = self.dir / "dagster_home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "dagster.yaml").write_text(
            f"""telemetry:
  enabled: false
storage:
  postgres:
    postgres_db:
      hostname: 127.0.0.1
      port: {self.ports["postgres"]}
      username: {PG_USER}
      password:
        env: ZIPLINE_PG_PASSWORD
      db_name: {PG_DB}
      # SQLAlchemy 2.1 defaults postgresql:// to psycopg 3; dagster-postgres ships psycopg2
      scheme: postgresql+psycopg2
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: {DAEMON_INTERVAL_S}
# a run that fails (a lost Ray node, the database restarted under it) runs once more
run_retries:
  enabled: true
  max_retries: 1
# a run whose process died is marked failed (and so retried) instead of hanging
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
concurrency:
  runs:
    max_concurrent_runs: 4
  pools:
    granularity: op
"""
        )

    def _start_dagster_daemon(self, name: str) -> None:
        self._dagster_home()
        env = self.env()
        pool = subprocess.run(
            [str(BIN / "dagster"), "instance", "concurrency", "set", TRAINING_POOL,
             str(TRAINING_POOL_LIMIT)],
            env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if pool.returncode != 0:
            raise ClusterError(f"setting the pool limit failed: {pool.stderr[-2000:]}")
        # its backfill daemon passes every DAEMON_INTERVAL_S (Dagster's own: 30 s, no setting)
        daemon = (
            "from zipline_dagster.lineage.internals import run_daemon; "
            f"run_daemon(['run', '-w', {workspace()!r}], interval_s={DAEMON_INTERVAL_S})"
        )
        self._spawn(name, [str(BIN / "python"), "-c", daemon], env=env)
        self._wait(name, lambda: _daemon_heartbeating(env), timeout=180)

    def _start_dagster_webserver(self, name: str) -> None:
        port = self.port("webserver")
        self._spawn(
            name,
            [str(BIN / "dagster-webserver"), "-w", workspace(), "-h", "127.0.0.1",
             "-p", str(port)],
            env=self.env(),
        )  # fmt: skip
        self._wait(
            name,
            lambda: urllib.request.urlopen(f"{self.web_url}/server_info", timeout=2).status == 200,
            timeout=180,
        )

    # -- the whole --------------------------------------------------------------------
    def up(self, only: Collection[str] = SERVICES) -> None:
        """Start every service (``only``: those of them, in their waves)."""
        unknown = sorted(set(only) - set(SERVICES))
        if unknown:
            raise ClusterError(f"unknown services {unknown}; the topology has {list(SERVICES)}")
        live = self.running()
        if live:
            raise ClusterError(
                f"a cluster is already running from {self.dir} ({', '.join(live)}); "
                "`make cluster-down` stops it first"
            )
        # a fresh deployment: moto keeps S3 in memory, so Postgres's records and the
        # warehouse start empty with it
        for folder in (
            "postgres",
            "zipline",
            "dagster_home",
            "secrets",
            "logs",
            "spark-work",
            "spark-conf",
        ):
            shutil.rmtree(self.dir / folder, ignore_errors=True)
        shutil.rmtree(self.pg_dir, ignore_errors=True)  # a fresh deployment's server too
        from concurrent.futures import ThreadPoolExecutor

        ports = {"spark": free_port(7077)}
        names = ("postgres", "s3", "ray_gcs", "ray_dashboard", "spark_ui", "spark_worker_ui",
                 "webserver")  # fmt: skip
        ports.update(zip(names, free_ports(len(names), avoid=ports.values()), strict=True))
        self.state = {"services": {}, "ports": ports}
        self._save()

        def start(name: str) -> None:
            t0 = time.monotonic()
            self.start(name)
            print(f"  {name} up ({time.monotonic() - t0:.1f}s)", flush=True)

        try:
            for wave in START_WAVES:
                names = [name for name in wave if name in only]
                if not names:
                    continue
                with ThreadPoolExecutor(len(names)) as pool:
                    for future in [pool.submit(start, name) for name in names]:
                        future.result()  # the first failure, once the wave has settled
        except BaseException:
            self.down()
            raise

    def down(self) -> list[str]:
        """Stop every service: Dagster's first (the others' clients), then the workers,
        then what they hang on; each wave at once."""
        from concurrent.futures import ThreadPoolExecutor

        stopped = []
        for wave in STOP_WAVES:
            with ThreadPoolExecutor(len(wave)) as pool:
                done = dict(zip(wave, pool.map(self._terminate, wave), strict=True))
            for name in wave:  # the state file is written here, by one thread
                self.state["services"].pop(name, None)
                if done[name]:
                    stopped.append(name)
            self._save()
        for temp in (self.ray_temp, *self.ray_temp.parent.glob(f"{self.ray_temp.name}-*")):
            shutil.rmtree(temp, ignore_errors=True)
        return stopped

    def placement(self) -> list[str]:
        """Where the Ray jobs ran: each node's jobs (drivers) and tasks, by service name."""
        from ray.job_submission import JobSubmissionClient
        from ray.util.state import list_tasks

        address = self.env(secret=False)["RAY_ADDRESS"]
        names: dict[str, str] = {}
        for node in self.ray_nodes():
            raylet = node.get("raylet", {})
            node_id = str(raylet.get("nodeId", ""))
            names[node_id] = "head" if raylet.get("isHeadNode") else "worker"
        workers = sorted(n for n, kind in names.items() if kind == "worker")
        for i, node_id in enumerate(workers, 1):
            names[node_id] = f"ray-worker-{i}"

        def where(node_id: str | None) -> str:
            name = names.get(str(node_id), "a node no longer alive")
            return f"{name} ({str(node_id)[:8]})"

        jobs = [j for j in JobSubmissionClient(address).list_jobs() if j.submission_id]
        drivers = Counter(where(job.driver_node_id) for job in jobs)
        tasks = Counter(
            where(task.node_id)
            for task in list_tasks(address=address, limit=10_000, raise_on_missing_output=False)
            if task.type == "NORMAL_TASK"
        )
        head = next((f"head ({n[:8]})" for n, kind in names.items() if kind == "head"), "head")
        return [
            f"Ray: {len(jobs)} jobs; drivers on "
            + ", ".join(f"{k}: {v}" for k, v in sorted(drivers.items())),
            "Ray: partition tasks on "
            + (", ".join(f"{k}: {v}" for k, v in sorted(tasks.items())) or "none"),
            f"Ray: the {head} has 0 CPUs and ran "
            + str(drivers.get(head, 0) + tasks.get(head, 0))
            + " drivers or tasks",
            f"Spark master: {self.spark_master}",
            f"Postgres (the Dagster instance): {self.dsn}",
            f"Dagster UI: {self.web_url}",
        ]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _daemon_heartbeating(env: dict[str, str]) -> bool:
    out = subprocess.run(
        [str(BIN / "dagster-daemon"), "liveness-check"],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return out.returncode == 0


def _others_can_reach(path: Path) -> bool:
    """Whether another user can walk down to ``path`` (every folder above it is o+x)."""
    return all(p.stat().st_mode & 0o001 for p in [*reversed(path.resolve().parents)] if p.exists())


def _as_postgres_user() -> list[str]:
    """PostgreSQL refuses to run as root: as root, its commands run as Debian's
    ``postgres`` user (``setpriv`` execs them, so the recorded PID is the server's)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _chown_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
        for p in path.rglob("*"):
            shutil.chown(p, "postgres", "postgres")


def _register(pid: int, what: str) -> None:
    """Recorded for the test run's cleanup too, when tests started it."""
    folder = os.environ.get("ZD_TEST_PROCESSES")
    if folder:
        record = {**ProcessIdentity.of(pid).as_dict(), "group": True, "what": f"cluster {what}"}
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{pid}.json").write_text(json.dumps(record))


def _unregister(pid: int) -> None:
    folder = os.environ.get("ZD_TEST_PROCESSES")
    if folder:
        (Path(folder) / f"{pid}.json").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/cluster.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "command", choices=["up", "down", "status", "env", "demo", "stop", "start", "kill"]
    )
    p.add_argument("service", nargs="?", choices=SERVICES)
    p.add_argument(
        "--process",
        action="store_true",
        help="kill: the service's own process only, not what it started",
    )
    args = p.parse_args(argv)
    cluster = Cluster()
    try:
        if args.command == "up":
            t0 = time.monotonic()
            print(f"starting the cluster in {cluster.dir}", flush=True)
            cluster.up()
            print(f"cluster up in {time.monotonic() - t0:.0f}s")
            print(f"  Dagster UI     {cluster.web_url}")
            print(f"  Postgres       {cluster.dsn}")
            print(f"  Ray dashboard  {cluster.env(secret=False)['RAY_ADDRESS']}")
            print(f"  Spark master   {cluster.spark_master}")
            print(f"  S3             {cluster.env(secret=False)['AWS_ENDPOINT_URL']}")
        elif args.command == "down":
            stopped = cluster.down()
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        elif args.command == "status":
            live = set(cluster.running())
            for name in SERVICES:
                print(f"{name:18} {'running' if name in live else 'stopped'}")
            return 0 if live == set(SERVICES) else 1
        elif args.command == "demo":
            return demo(cluster)
        elif args.command == "env":
            for k, v in cluster.env(secret=False).items():
                print(f"export {k}={shlex.quote(v)}")
        elif args.service is None:
            p.error(f"{args.command} needs a service: {', '.join(SERVICES)}")
        elif args.command == "stop":
            cluster.stop(args.service)
        elif args.command == "kill":
            cluster.kill(args.service, group=not args.process)
        else:
            cluster.start(args.service)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def demo(cluster: Cluster) -> int:
    """``make demo-cluster``: the demo through the deployment (``scripts/demo.py --cluster``),
    then where each piece ran."""
    missing = sorted(set(SERVICES) - set(cluster.running()))
    if missing:
        raise ClusterError(
            f"the cluster in {cluster.dir} is not up ({', '.join(missing)} not running); "
            "`make cluster-up` first"
        )
    t0 = time.monotonic()
    code = subprocess.run(
        [str(BIN / "python"), str(ROOT / "scripts" / "demo.py"), "--cluster", cluster.web_url],
        env={**os.environ, **cluster.env()}, cwd=ROOT,
    ).returncode  # fmt: skip
    if code == 0:
        print("      where it ran:")
        for line in cluster.placement():
            print(f"      {line}")
    print(f"demo-cluster {'passed' if code == 0 else 'FAILED'} in {time.monotonic() - t0:.0f}s")
    return code


if __name__ == "__main__":
    sys.exit(main())
