"""``make dev``: ``dagster dev`` (webserver, daemon, code servers) that stops whole.

``dagster dev`` runs in a session of its own; this process forwards Ctrl-C (SIGINT) and
SIGTERM to that whole process group (a grace period, then SIGKILL), so that nothing of
it is left running. Before, SIGTERM to ``make dev`` ended ``dagster dev`` but left its
daemon running ("Received interrupt", and it stayed), and a newcomer killed the children
one by one.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    from zipline_dagster.processes import ProcessIdentity, terminate

    port = os.environ.get("DEV_PORT", "3000")
    dagster = str(Path(sys.executable).parent / "dagster")
    proc = subprocess.Popen(
        [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", port, *argv],
        cwd=ROOT,
        start_new_session=True,  # its own group: the terminal's Ctrl-C reaches us only
    )
    identity = ProcessIdentity.of(proc.pid)
    stopping: list[int] = []

    def stop(sig: int, _frame: object) -> None:
        stopping.append(sig)
        # dagster dev winds its children down on SIGTERM; what stays after the grace
        # period (its daemon's threads take longer) is killed
        terminate(identity, group=True, timeout=15.0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = proc.wait()
    if stopping:
        print("make dev: stopped dagster dev and everything it started", file=sys.stderr)
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
