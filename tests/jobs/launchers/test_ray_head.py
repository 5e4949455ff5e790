"""The embedded head: started once, reused across processes, stopped by its own command."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cleanup import register, unregister
from tests.conftest import run_cli
from zipline_dagster.jobs.launchers.ray_client import RayUnreachableError
from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
from zipline_dagster.processes import ProcessIdentity


@pytest.mark.ray
def test_ray_up_is_shared_and_down_stops_it(tmp_path: Path) -> None:
    state = str(tmp_path / "ray")
    # Two `up` at once: one head, both report the same dashboard.
    results: list[str] = []

    def up() -> None:
        res = run_cli("ray", "up", "--state-dir", state, "--num-cpus", "1")
        assert res.returncode == 0, res.stderr
        results.append(res.stdout)

    threads = [threading.Thread(target=up) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        dashboards = {
            line.split("dashboard=")[1].split()[0]
            for out in results
            for line in out.splitlines()
            if "dashboard=" in line
        }
        assert len(dashboards) == 1
        (dashboard,) = dashboards
        assert dashboard.startswith("http://127.0.0.1:")  # loopback only
        status = run_cli("ray", "status", "--state-dir", state)
        assert status.returncode == 0 and dashboard in status.stdout
        head = json.loads((tmp_path / "ray" / "head.json").read_text())
        register(head["pid"], group=True, what="Ray head (ray up test)")
        assert head["dashboard_url"] == dashboard
        # the state file names the process by PID *and* start time
        assert ProcessIdentity(pid=head["pid"], start=head["pid_start"]).alive()
        # its processes' temporary files are in its own folder, which `down` removes: the
        # dashboard's forkserver, killed, left a /tmp/pymp-* folder at every head's end
        deadline = time.monotonic() + 10
        while not list(Path(head["temp_dir"]).glob("pymp-*")):
            assert time.monotonic() < deadline, "no pymp-* folder in the head's own folder"
            time.sleep(0.2)
    finally:
        down = run_cli("ray", "down", "--state-dir", state)
        unregister(head["pid"])
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not Path(head["temp_dir"]).exists()
    status = run_cli("ray", "status", "--state-dir", state)
    assert status.returncode == 3 and "no embedded ray head" in status.stdout


@pytest.mark.ray
def test_a_head_whose_state_folder_was_deleted_is_found_again_not_doubled(
    tmp_path: Path,
) -> None:
    """A user resets ZIPLINE_HOME (its ray/ state folder deleted) while the embedded head
    runs: the next `ray up` finds that head again (one head per state folder, recorded
    again) instead of starting a second one beside it, and `ray down` stops it."""
    import shutil

    state = tmp_path / "ray"
    up = ("ray", "up", "--state-dir", str(state), "--num-cpus", "1")
    first = run_cli(*up)
    assert first.returncode == 0, first.stderr
    head = json.loads((state / "head.json").read_text())
    register(head["pid"], group=True, what="Ray head (state folder reset test)")
    try:
        shutil.rmtree(state)
        again = run_cli(*up)
        assert again.returncode == 0, again.stderr
        assert f"pid={head['pid']} dashboard={head['dashboard_url']}" in again.stdout
        assert json.loads((state / "head.json").read_text())["pid"] == head["pid"]
        shutil.rmtree(state)
    finally:
        down = run_cli("ray", "down", "--state-dir", str(state))
    assert down.returncode == 0 and "ray head stopped" in down.stdout, down.stdout
    gone = ProcessIdentity(pid=head["pid"], start=head["pid_start"])
    deadline = time.monotonic() + 10  # `down` sends SIGKILL after 3 s and returns
    while gone.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not gone.alive()  # else the session's cleanup stops it (still registered)
    unregister(head["pid"])


@pytest.fixture
def other_version_dashboard() -> Iterator[str]:
    """A loopback HTTP server answering /api/version as a Ray 2.9.3 cluster would.

    Stands in for a cluster of another Ray version: installing a second Ray here to run
    a real one is not possible in one environment.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"version": "4", "ray_version": "2.9.3", "ray_commit": "x"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_version_mismatch_is_refused_before_submitting(other_version_dashboard: str) -> None:
    import ray

    runner = RayJobRunner(address=other_version_dashboard)
    with pytest.raises(RayUnreachableError) as exc:
        runner.client()
    msg = str(exc.value)
    assert "Ray version mismatch" in msg and "2.9.3" in msg and ray.__version__ in msg


def test_ray_client_address_is_refused_with_hint() -> None:
    with pytest.raises(RayUnreachableError, match="dashboard address"):
        RayJobRunner(address="ray://head:10001")


def test_down_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """head.json names a PID that now belongs to another program (the head died, the PID
    was reused, e.g. after a reboot): `down`, `status` and `up`'s stale-state path must
    leave that program alone."""
    import subprocess
    import time

    from zipline_dagster.jobs.launchers.ray_head import LocalRayHead

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = tmp_path / "ray"
        state.mkdir()
        (state / "head.json").write_text(
            json.dumps(
                {
                    "pid": other.pid,
                    "dashboard_url": "http://127.0.0.1:9",
                    "gcs_address": "127.0.0.1:9",
                    "ray_version": "2.60.0",
                    "log_path": str(state / "head.log"),
                    "started_at": time.time() - 3600,
                    # the start token of the head that once had this PID
                    "pid_start": "an-earlier-boot:12345",
                }
            )
        )
        assert LocalRayHead(state).status() is None
        down = run_cli("ray", "down", "--state-dir", str(state))
        assert down.returncode == 0 and "no embedded ray head was running" in down.stdout
        time.sleep(0.5)
        assert other.poll() is None, "down signalled a process it did not start"
    finally:
        other.kill()
        other.wait()


def head_processes(head_pid: int) -> dict[int, str]:
    """The processes of the head's session (the head, its daemons, the workers its raylet
    started), by PID, with the title each shows in ``ps``."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # ended meanwhile
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[3]) == head_pid:  # its session id
            out[int(entry.name)] = title
    return out


@pytest.mark.ray
def test_the_embedded_head_keeps_no_idle_worker_after_a_job(tmp_path: Path) -> None:
    """The embedded head starts no spare worker for its job manager: no job could use it
    (each job has its own runtime_env) and it would idle at a hundredth of a core for the
    head's life, CPU the next job's workers need on a small machine."""
    import time
    from contextlib import contextmanager

    from ray.job_submission import JobStatus, JobSubmissionClient

    from tests.conftest import running_head

    with contextmanager(running_head)(tmp_path / "ray", "Ray head (idle worker test)") as head:
        client = JobSubmissionClient(head.dashboard_url)
        job = client.submit_job(entrypoint="python -c 'print(1)'")
        deadline = time.monotonic() + 120
        while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED}:
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.2)
        assert client.get_job_status(job) == JobStatus.SUCCEEDED
        time.sleep(3)  # the job's own processes end with it
        titles = head_processes(head.pid).values()
        assert any("raylet" in t for t in titles)  # the head's session, as expected
        assert not [t for t in titles if t.startswith("ray::IDLE")], sorted(titles)
        assert any("log_monitor.py" in t for t in titles)  # on by default


@pytest.mark.ray
def test_a_head_started_without_its_log_monitor_runs_none(ray_head: Any) -> None:
    """``LocalRayHead(log_monitor=False)``, as the tests' shared head is started: no log
    monitor among the head's processes, and jobs still run on it (every Ray test here)."""
    titles = head_processes(ray_head.pid).values()
    assert any("raylet" in t for t in titles)
    assert not [t for t in titles if "log_monitor.py" in t], sorted(titles)


@pytest.mark.ray
def test_ports_another_program_holds_are_given_up_for_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port chosen free can be taken by another program before Ray binds it. Each of the
    head's four ports is held here, one per start, by a listening socket (only the choice
    of ports is steered: `free_ports` hands out a held one; Ray's bind really fails).
    Before, a taken GCS port failed the start after 42 s, a taken dashboard port at the
    timeout, a taken agent port gave a head that refused every job ("No available
    agent"), and a taken client server port a head that died once it had answered."""
    import contextlib
    import re
    import socket

    from ray.job_submission import JobStatus, JobSubmissionClient

    from zipline_dagster.jobs.launchers import ray_head
    from zipline_dagster.processes import free_ports

    held: list[socket.socket] = []
    given: list[list[int]] = []

    def ports_with_one_held(count: int, avoid: list[int]) -> list[int]:
        ports = free_ports(count, avoid=avoid)
        if len(given) < 4:  # GCS, dashboard, client server, agent: one a start
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            held.append(sock)
            ports[len(given)] = sock.getsockname()[1]
        given.append(ports)
        return ports

    monkeypatch.setattr(ray_head, "free_ports", ports_with_one_held)
    head = ray_head.LocalRayHead(tmp_path / "ray", num_cpus=1)
    info = None
    try:
        info = head.ensure_running(timeout=60)  # a start waited out raises RayHeadError
        register(info.pid, group=True, what="Ray head (held ports test)")
        # four starts given up, one on each held port, and the fifth on free ones
        assert len(given) == 5 and info.gcs_address == f"127.0.0.1:{given[-1][0]}"
        # the head takes jobs, and no process of the given-up starts is left
        client = JobSubmissionClient(info.dashboard_url)
        job = client.submit_job(entrypoint="echo ok")
        deadline = time.monotonic() + 60
        while not client.get_job_status(job).is_terminal():
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert client.get_job_status(job) == JobStatus.SUCCEEDED
        earlier = re.compile(
            rb"[=:](%s)\b" % "|".join(str(p) for ps in given[:4] for p in ps).encode()
        )
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                command = (proc / "cmdline").read_bytes()
                assert not earlier.search(command), command.replace(b"\0", b" ")
    finally:
        head.stop()
        for sock in held:
            sock.close()
        if info is not None:
            unregister(info.pid)
