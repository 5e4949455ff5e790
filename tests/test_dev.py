"""``make dev`` stops whole: SIGTERM to its process, or Ctrl-C (SIGINT to the terminal's
process group), ends ``dagster dev``, its webserver, daemon and code servers. Real
processes: ``make dev`` on a disposable Dagster home and a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cleanup import register, unregister
from tests.conftest import ROOT, free_port, wait_http
from zipline_dagster.processes import ProcessIdentity, descendants, terminate


def started(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[ProcessIdentity]]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "ZIPLINE_HOME": str(tmp_path / "zipline")}
    log = (tmp_path / "dev.log").open("wb")
    make = subprocess.Popen(
        ["make", "--no-print-directory", "dev", f"DEV_PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # as a terminal's foreground job: its own process group
    )
    register(make.pid, group=True, what="make dev")
    try:
        wait_http(f"http://127.0.0.1:{port}/server_info", timeout=180)
        deadline = time.monotonic() + 60
        # the daemon is the one that stayed running: wait until it runs
        while not any(b"dagster._daemon" in cmdline(p) for p in descendants(make.pid)):
            assert time.monotonic() < deadline, "dagster dev started no daemon"
            time.sleep(1)
    except BaseException:
        for p in descendants(make.pid):
            terminate(p, group=False)
        terminate(ProcessIdentity.of(make.pid), group=True)
        raise
    below = descendants(make.pid)
    for p in below:  # dagster dev's own session, should the test fail
        register(p.pid, group=False, what="make dev's child")
    return make, below


def cmdline(p: ProcessIdentity) -> bytes:
    try:
        return Path(f"/proc/{p.pid}/cmdline").read_bytes()
    except OSError:
        return b""


def ended(make: subprocess.Popen[bytes], below: list[ProcessIdentity]) -> None:
    make.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(p.alive() for p in below) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p.pid for p in below if p.alive()]
    assert not left, f"left running after make dev stopped: {left}"
    unregister(make.pid)
    for p in below:
        unregister(p.pid)


@pytest.mark.slow
@pytest.mark.parametrize(
    "how",
    [
        lambda make: os.kill(make.pid, signal.SIGTERM),  # SIGTERM to make's process
        lambda make: os.killpg(make.pid, signal.SIGINT),  # Ctrl-C in its terminal
    ],
    ids=["sigterm", "ctrl-c"],
)
def test_make_dev_stops_whole(tmp_path: Path, how: object) -> None:
    make, below = started(tmp_path)
    assert len(below) >= 3  # dagster dev, its webserver, its daemon (and code servers)
    how(make)  # type: ignore[operator]
    ended(make, below)
