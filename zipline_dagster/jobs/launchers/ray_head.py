"""The embedded Ray head: started once on loopback, reused across runs and processes.

State lives in ``$ZIPLINE_HOME/ray/``: ``head.json`` (pid, addresses, version), the head's
log, and a lock file that makes two runs starting at once share one head. The head runs
``ray start --head --block`` in its own process group, so ``stop`` ends exactly this
head and nothing else of Ray's on the machine (unlike ``ray stop``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from zipline_dagster.processes import ProcessIdentity, free_ports, group_listens, terminate
from zipline_dagster.settings import zipline_home

#: The embedded head binds to loopback only and runs without token auth. It is set
#: explicitly on the head and every client: an in-process ``ray.init()`` writes a token
#: (``~/.ray/auth_token``) that turns token auth on for later heads and clients
#: (docs/deployment.md, "Auth").
EMBEDDED_AUTH_MODE = "disabled"

#: Settings of the embedded head, a small head whose own processes share the machine
#: with the jobs (measured on 2 cores; the caller's environment overrides them):
#: - Ray starts a spare worker for the first driver (its job manager), which no job can
#:   use (every job has its own runtime_env) and which then idles at about 0.01 of a core
#:   for the head's life;
#: - the log monitor keeps every worker log file it has read open and checks each one ten
#:   times a second until 200 are open: after 20 small jobs it took 0.021 of a core, 0.013
#:   with 16 (past the limit it closes them all, and moves those of ended workers to
#:   ``logs/old``; nothing unread is lost);
#: - metrics collection (each Ray process's metrics, exported for a Prometheus to scrape,
#:   which an embedded head has none of; the dashboard's job, task and node views come
#:   from elsewhere and stay): off, the idle head took 0.059-0.063 of a core instead of
#:   0.072-0.079, and its raylet, GCS and agent about a fifth less while a fan-out ran.
EMBEDDED_HEAD_ENV = {
    "RAY_prestart_worker_first_driver": "0",
    "RAY_LOG_MONITOR_MAX_OPEN_FILES": "16",
    "RAY_enable_metrics_collection": "0",
}


class RayHeadError(RuntimeError):
    """The embedded Ray head could not be started or reached."""


@dataclass(frozen=True)
class HeadInfo:
    pid: int
    dashboard_url: str
    gcs_address: str
    ray_version: str
    log_path: str
    started_at: float
    #: start token of ``pid`` (see ``processes.py``): the head is signalled only while
    #: the PID still names the process this state file recorded
    pid_start: str = ""
    #: the head's Ray temp folder (sessions, logs, runtime envs); removed by ``stop``
    temp_dir: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def process(self) -> ProcessIdentity:
        return ProcessIdentity(pid=self.pid, start=self.pid_start)


#: Starts of the head on new ports after a Ray process found one taken.
START_ATTEMPTS = 5

#: What the GCS, the dashboard, its agent and the client server log when another
#: program holds their port (measured on Ray 2.60 with a listening socket on each).
_PORT_TAKEN = ("already occupied", "already in use", "Failed to start the grpc server")


def _version_at(dashboard_url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(f"{dashboard_url}/api/version", timeout=timeout) as r:
            return str(json.load(r).get("ray_version"))
    except Exception:
        return None


class LocalRayHead:
    """Start, find and stop the embedded head under ``state_dir``.

    Args:
        state_dir: where ``head.json``, the log and the lock live
            (default ``$ZIPLINE_HOME/ray``).
        num_cpus: CPUs the head offers (default: all of the machine's).
        env: extra environment for the head; jobs inherit the head's environment,
            which is where platform-injected secrets belong (never in ``runtime_env``).
        log_monitor: whether the head runs Ray's log monitor, which streams workers'
            output to their drivers (a job's log shows what its tasks and actors print,
            as a Ray Train trainer's workers do). Off, it saves the 1% of a core the
            monitor takes while the head idles; a driver then sees only its own output.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        num_cpus: int | None = None,
        env: dict[str, str] | None = None,
        log_monitor: bool = True,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else zipline_home() / "ray"
        self.num_cpus = num_cpus
        self.env = dict(env or {})
        self.log_monitor = log_monitor

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "head.json"

    @property
    def temp_dir(self) -> Path:
        """Ray's session folder root for this head (logs, sockets, runtime envs: a pip
        runtime env clones the environment, about 2 GB). Its own, so ``stop`` removes
        exactly it; short, because Ray's socket paths must fit in 107 characters."""
        import hashlib
        import tempfile

        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"zd-ray-{digest}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.state_dir / "head.lock", "w")  # noqa: SIM115
        except OSError as exc:
            raise RayHeadError(
                f"cannot use {self.state_dir} as the embedded Ray head's state folder "
                f"({type(exc).__name__}: {exc}); set ZIPLINE_HOME (or the resource's "
                "embedded_state_dir) to a writable folder, or RAY_ADDRESS to a running cluster"
            ) from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @property
    def _copy(self) -> Path:
        """The state file's copy in the head's own temp folder, which is named after the
        state folder: a head whose state folder was deleted while it ran (a reset
        ``ZIPLINE_HOME``) is found again, rather than left running beside a second one."""
        return self.temp_dir / "zd-head.json"

    def _read(self) -> HeadInfo | None:
        for record in (self._state_file, self._copy):
            try:
                return HeadInfo(**json.loads(record.read_text()))
            except (FileNotFoundError, ValueError, TypeError):
                continue
        return None

    def _write(self, info: HeadInfo) -> None:
        for record in (self._state_file, self._copy):
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(info.as_dict(), indent=2))
            os.replace(tmp, record)

    def status(self) -> HeadInfo | None:
        """The running head, or None when there is none (or it stopped answering)."""
        info = self._read()
        if info and info.process.alive() and _version_at(info.dashboard_url):
            return info
        return None

    def ensure_running(self, timeout: float = 120.0) -> HeadInfo:
        """Return the running head, starting it first when there is none.

        Safe when several processes call it at once: one starts, the others wait on
        the lock and then find it running.
        """
        with self._locked():
            info = self.status()
            if info:
                if not self._state_file.is_file():  # found by its copy: recorded again
                    self._write(info)
                return info
            stale = self._read()
            if stale:  # our head, no longer answering: stop what is left of it
                terminate(stale.process, group=True)
            return self._start(timeout)

    def _start(self, timeout: float) -> HeadInfo:
        """Start the head on four new ports; on ports another program took meanwhile,
        again on others (before, a taken GCS port failed the start after 42 s, a taken
        dashboard port at the timeout, a taken agent port gave a head that refused every
        job, and a taken client server port a head that died once it had answered)."""
        given: list[int] = []
        for _ in range(START_ATTEMPTS):
            ports = free_ports(4, avoid=given)
            given += ports
            info = self._start_on(ports, timeout)
            if info is not None:
                return info
        raise RayHeadError(
            f"the embedded Ray head found one of its ports taken by another program "
            f"{START_ATTEMPTS} times in a row (ports {given}; log {self.state_dir / 'head.log'})"
        )

    def _start_on(self, ports: list[int], timeout: float) -> HeadInfo | None:
        """The head on ``ports`` once it answers and its processes listen on all four;
        None when a Ray process said another program holds one (the head then stopped)."""
        import ray

        gcs_port, dash_port, client_port, agent_port = ports
        log_path = self.state_dir / "head.log"
        cmd = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--port={gcs_port}",
            f"--dashboard-port={dash_port}",
            f"--ray-client-server-port={client_port}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        if self.num_cpus is not None:
            cmd.append(f"--num-cpus={self.num_cpus}")
        if not self.log_monitor:
            cmd.append("--include-log-monitor=false")
        inherited = dict(os.environ)  # the head's processes inherit this one's environment
        env = {
            **EMBEDDED_HEAD_ENV,
            **inherited,
            **self.env,
            "RAY_AUTH_MODE": EMBEDDED_AUTH_MODE,
            "RAY_USAGE_STATS_ENABLED": "0",
            # the temporary files of its processes (the dashboard's forkserver leaves a
            # pymp-* folder behind when killed) and jobs go where `stop` removes them
            "TMPDIR": str(self.temp_dir),
            # Job entrypoints run `python -m ...` through a shell: it must be this
            # environment's python, where the platform's packages are installed.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{inherited.get('PATH', '')}",
        }
        env.pop("RAY_ADDRESS", None)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        dashboard_url = f"http://127.0.0.1:{dash_port}"
        identity = ProcessIdentity.of(proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._port_taken(log_path, ports):
                terminate(identity, group=True, timeout=1.0)
                return None
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RayHeadError(
                    f"the embedded Ray head exited with code {proc.returncode} while starting "
                    f"(command: {' '.join(cmd[1:])}; log {log_path}); last lines:\n{tail}"
                )
            version = _version_at(dashboard_url, timeout=1.0)
            if version and group_listens(proc.pid, ports):  # the client server's too
                info = HeadInfo(
                    pid=proc.pid,
                    dashboard_url=dashboard_url,
                    gcs_address=f"127.0.0.1:{gcs_port}",
                    ray_version=version,
                    log_path=str(log_path),
                    started_at=time.time(),
                    pid_start=identity.start,
                    temp_dir=str(self.temp_dir),
                )
                self._write(info)
                if version != ray.__version__:
                    raise RayHeadError(
                        f"embedded head runs Ray {version}, client {ray.__version__}"
                    )
                return info
            time.sleep(0.3)
        terminate(identity, group=True)
        raise RayHeadError(
            f"the embedded Ray head did not answer within {timeout:.0f}s (log {log_path})"
        )

    def _port_taken(self, log_path: Path, ports: list[int]) -> bool:
        """Whether the head's log or a log of its Ray processes says one of ``ports`` is
        held by another program (each component words it its own way)."""
        taken = re.compile(rf"\b({'|'.join(map(str, ports))})\b")
        logs = [log_path, *(self.temp_dir / "session_latest" / "logs").glob("*")]
        for path in logs:
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    if any(m in line for m in _PORT_TAKEN) and taken.search(line):
                        return True
        return False

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop the head this state dir started; True when one was running. Its group is
        killed ``timeout`` after SIGTERM: the head holds nothing that needs a graceful end
        (steps commit what jobs wrote; its session folder is removed here), and on SIGTERM
        its autoscaler monitor, once the GCS is gone, never exits (a 10 s `ray down`)."""
        with self._locked():
            info = self._read()
            self._state_file.unlink(missing_ok=True)
            # A PID reused since (another program, after a reboot) is never signalled.
            stopped = info is not None and terminate(info.process, group=True, timeout=timeout)
            if stopped or info is None:
                import shutil

                shutil.rmtree(self.temp_dir, ignore_errors=True)
            return stopped
