"""Process identity: a PID is signalled only while it names the process that was recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cleanup import stop_recorded
from zipline_dagster.processes import ProcessIdentity, free_ports, terminate


def test_identity_changes_with_the_process() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        me = ProcessIdentity.of(proc.pid)
        assert me.alive()
        assert not ProcessIdentity(pid=proc.pid, start=me.start + "0").alive()
    finally:
        proc.kill()
        proc.wait()
    assert not me.alive()


@pytest.mark.slow
def test_ci_cleanup_stops_what_was_recorded_and_nothing_else(tmp_path: Path) -> None:
    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)
    theirs = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = {**ProcessIdentity.of(ours.pid).as_dict(), "group": True, "what": "ours"}
        (tmp_path / f"{ours.pid}.json").write_text(json.dumps(record))
        # a record whose PID was reused by another program since
        stale = {"pid": theirs.pid, "start": "another-boot:1", "group": True, "what": "gone"}
        (tmp_path / f"{theirs.pid}.json").write_text(json.dumps(stale))
        out = subprocess.run(
            [sys.executable, "-m", "tests.cleanup", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert out.returncode == 0, out.stderr
        assert f"stopped leftover ours (pid {ours.pid})" in out.stdout
        assert ours.wait(10) is not None
        assert theirs.poll() is None, "cleanup signalled a process the tests did not start"
        assert list(tmp_path.iterdir()) == []
        assert stop_recorded(tmp_path) == []
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()


def test_terminate_skips_a_dead_identity() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert terminate(ProcessIdentity(pid=proc.pid, start="x"), group=False) is False


def test_descendants_include_a_child_in_a_session_of_its_own() -> None:
    """What a process started, found before it is killed: a grandchild in its own
    session (as Ray starts a job's driver) is outside the group, not outside the tree."""
    from zipline_dagster.processes import descendants

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    grandchild = int(parent.stdout.readline())  # type: ignore[union-attr]
    try:
        assert grandchild in [p.pid for p in descendants(parent.pid)]
        assert descendants(grandchild) == []
    finally:
        os.kill(grandchild, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_ports_chosen_together_are_distinct_free_and_not_the_ones_to_avoid() -> None:
    """A Ray head (embedded, or the cluster's) is given four ports at once. Picked one at
    a time, the kernel handed out one port twice in a `make test` run and the head refused
    to start ("dashboard is trying to use a port number ... used by other components"); of
    500 ports picked one at a time, some repeat on every try here."""
    import socket

    avoid = set(free_ports(20))
    ports = free_ports(500, avoid=avoid)
    assert len(set(ports)) == 500 and not avoid & set(ports)
    for port in ports[:50]:  # free: each can be bound now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
