"""Stop exactly the services the tests started, by recorded PID and start time.

Fixtures that start a long-lived service (a Ray head or node, the S3 server, `dagster
dev`) record it here when ``ZD_TEST_PROCESSES`` names a folder; they stop it themselves
when they end. ``.ci/run`` runs ``python -m tests.cleanup "$ZD_TEST_PROCESSES"`` on exit so
that nothing outlives a killed test run, and nothing else on the machine is touched: a
record whose PID now names another process is skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from zipline_dagster.processes import ProcessIdentity, terminate

ENV = "ZD_TEST_PROCESSES"


def _folder() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def register(pid: int, *, group: bool, what: str) -> None:
    """Record a service this test run started (no-op unless ``ZD_TEST_PROCESSES`` is set)."""
    folder = _folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    record = {**ProcessIdentity.of(pid).as_dict(), "group": group, "what": what}
    (folder / f"{pid}.json").write_text(json.dumps(record))


def unregister(pid: int) -> None:
    folder = _folder()
    if folder is not None:
        (folder / f"{pid}.json").unlink(missing_ok=True)


def stop_recorded(folder: Path) -> list[str]:
    stopped = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        identity = ProcessIdentity(pid=int(record["pid"]), start=str(record["start"]))
        if terminate(identity, group=bool(record["group"])):
            stopped.append(f"{record['what']} (pid {identity.pid})")
        path.unlink(missing_ok=True)
    return stopped


if __name__ == "__main__":
    for line in stop_recorded(Path(sys.argv[1])):
        print(f"stopped leftover {line}")
