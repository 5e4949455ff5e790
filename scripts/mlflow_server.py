"""A local MLflow tracking server on loopback: ``make demo-mlflow`` and ``make mlflow-down``
(``python scripts/mlflow_server.py up | down | status | url``), and the tests.

``mlflow server`` runs from its own locked environment (``.tools/mlflow``, locked in
``tests/services/mlflow``: the server's mlflow pins ``pyarrow<26``, the platform's
environment holds pyarrow 26), with a SQLite backend store and a local artifact root it
serves, in its own process group. Its PID and start time are recorded in
``.zipline/mlflow/state.json`` (``ZIPLINE_MLFLOW_DIR`` moves it), so ``down`` stops
exactly what ``up`` started. The platform talks to it over HTTP, as to any remote server.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zipline_dagster.processes import ProcessIdentity, terminate  # noqa: E402

MLFLOW = ROOT / ".tools" / "mlflow" / "bin" / "mlflow"


class MlflowServerError(RuntimeError):
    """The server cannot start, or is in a state the command refuses to act on."""


@dataclass(frozen=True)
class Server:
    folder: Path
    port: int
    identity: ProcessIdentity

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> bool:
        """Stop the server's process group (False: it had ended already)."""
        stopped = terminate(self.identity, group=True)
        (self.folder / "state.json").unlink(missing_ok=True)
        return stopped


def state_dir() -> Path:
    return Path(os.environ.get("ZIPLINE_MLFLOW_DIR") or ROOT / ".zipline" / "mlflow")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def running(folder: Path) -> Server | None:
    """The server recorded in ``folder``, if its process is still the one recorded."""
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError, KeyError):
        return None
    identity = ProcessIdentity(int(state["pid"]), str(state["start"]))
    return Server(folder, int(state["port"]), identity) if identity.alive() else None


def start(folder: Path, *, timeout: float = 120.0) -> Server:
    """Start a server keeping its store and artifacts in ``folder``; wait until it answers.

    Raises:
        MlflowServerError: one is already running there, the server environment is not
            installed, or it did not answer in ``timeout`` seconds (its log's tail said).
    """
    if not MLFLOW.exists():
        raise MlflowServerError(
            f"the MLflow server is not installed at {MLFLOW}: run it through make "
            "(`make demo-mlflow`, `make test`), which installs it from tests/services/mlflow"
        )
    found = running(folder)
    if found is not None:
        raise MlflowServerError(
            f"an MLflow server is already running from {folder} at {found.url} "
            f"(pid {found.identity.pid}); `make mlflow-down` stops it"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = (folder / "server.log").open("ab")
    proc = subprocess.Popen(
        [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, cwd=folder,
        # no job runner (MLflow's GenAI evaluation jobs, unused here): it keeps a queue
        # in a fresh /dev/shm folder per start that nothing removes, and a process more
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    identity = ProcessIdentity.of(proc.pid)
    server = Server(folder, port, identity)
    state = {**identity.as_dict(), "port": port}
    (folder / "state.json").write_text(json.dumps(state))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(0.3)
    server.stop()
    tail = (folder / "server.log").read_text(errors="replace").splitlines()[-15:]
    raise MlflowServerError(
        f"the MLflow server did not answer at {server.url} within {timeout:.0f}s; "
        "its log ends:\n" + "\n".join(tail)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/mlflow_server.py", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["up", "down", "status", "url"])
    args = p.parse_args(argv)
    folder = state_dir()
    server = running(folder)
    try:
        if args.command == "up":
            server = server or start(folder)
            print(f"MLflow tracking server at {server.url} (state in {folder})")
        elif args.command == "down":
            print(
                "stopped the MLflow server"
                if server and server.stop()
                else "no MLflow server was running"
            )
        elif args.command == "url":
            if server is None:
                raise MlflowServerError(f"no MLflow server runs from {folder}")
            print(server.url)
        else:
            print(f"running at {server.url}" if server else "stopped")
            return 0 if server else 1
    except MlflowServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
