"""Who a PID is: signal a process only when it is still the one that was started.

A PID recorded in a state file can be reused after the process ends (or after a reboot):
signalling it blindly can stop someone else's program. A process is identified by its
PID *and* its start time (``/proc/{pid}/stat`` field 22 with the boot id on Linux,
``ps -o lstart=`` elsewhere), recorded when it is started and compared before any signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/{pid}/stat`` line from field 3 on (state, parent, ...): the
    command name (field 2) may hold spaces and parentheses, so split after the last ')'."""
    return stat.rsplit(")", 1)[1].split()


def process_start(pid: int) -> str | None:
    """An opaque token that changes when ``pid`` names another process; None if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        stat = ""
    if stat:
        # field 22: start time in clock ticks since boot
        return f"{_boot_id()}:{_stat_fields(stat)[19]}"
    try:
        out = subprocess.run(
            ["ps", "-p", str(pid), "-o", "lstart="], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def descendants(pid: int) -> list[ProcessIdentity]:
    """Every process below ``pid`` (Linux: read from ``/proc``), children first, each as
    it is now: once ``pid`` is killed they belong to init, and only these still say so."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int(_stat_fields((entry / "stat").read_text())[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    found: list[ProcessIdentity] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            with contextlib.suppress(ProcessLookupError):
                found.append(ProcessIdentity.of(child))
            todo.append(child)
    return found


def pid_namespace() -> str:
    """This process's PID namespace ("" where there is none to tell: not Linux): PIDs
    compare only within one namespace (containers on one kernel each have their own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _here() -> dict[str, str]:
    """Where PIDs of this process's kind compare: host, boot and PID namespace."""
    return {"host": socket.gethostname(), "boot": _boot_id(), "pidns": pid_namespace()}


def holder_gone(owner: dict[str, object]) -> bool:
    """Whether the process an ``owner`` record names (``lock_owner``) has ended, as far as
    this process can tell: only one on this host, since this boot and in this PID
    namespace is checked (its PID with its start time, so a reused PID is not it);
    anything else is never taken for gone."""
    start, pid = owner.get("start"), owner.get("pid")
    if not isinstance(start, str) or not start or not isinstance(pid, int):
        return False
    here = all(owner.get(k) == v for k, v in _here().items())
    return here and process_start(pid) != start


def lock_owner() -> dict[str, object]:
    """Who holds a lock: this process (where it runs, its PID and start time) and when."""
    pid = os.getpid()
    return {**_here(), "pid": pid, "start": process_start(pid) or "", "at": time.time()}


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as it was when started: its PID and start token."""

    pid: int
    start: str

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        start = process_start(pid)
        if start is None:
            raise ProcessLookupError(f"no process {pid}")
        return cls(pid=pid, start=start)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def alive(self) -> bool:
        """True only while the PID still names the very process recorded."""
        return process_start(self.pid) == self.start


def terminate(identity: ProcessIdentity, *, group: bool, timeout: float = 8.0) -> bool:
    """SIGTERM the process (its whole process group when ``group``), SIGKILL after
    ``timeout``; nothing at all when the PID now names another process.

    Returns:
        True when the recorded process was running and was signalled.
    """
    if not identity.alive():
        return False

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(identity.pid, sig)
            else:
                os.kill(identity.pid, sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(identity.pid, os.WNOHANG)
        if not identity.alive() and not (group and group_alive(identity.pid)):
            return True
        time.sleep(0.2)
    if identity.alive() or (group and group_alive(identity.pid)):
        send(signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(identity.pid, os.WNOHANG)
    return True


def free_ports(count: int, *, avoid: Iterable[int] = ()) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now, none of ``avoid`` (ports
    already given to a service that may not listen yet). Every socket stays bound until
    all are chosen: picked one at a time, the kernel can hand out one port twice (a Ray
    head given it for two of its components refuses to start)."""
    taken = set(avoid)
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken:
                ports.append(port)
    return ports


def group_listens(pgid: int, ports: Iterable[int]) -> bool:
    """Whether processes of group ``pgid`` listen on every TCP port of ``ports`` (not
    another program); True where ``/proc/net/tcp`` is not there to say (not Linux)."""
    sockets: dict[str, int] = {}  # a listening socket's inode -> its port
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()  # local address, state and inode are 1, 3 and 9
                if fields[3] == "0A":  # LISTEN
                    sockets[f"socket:[{fields[9]}]"] = int(fields[1].rsplit(":", 1)[1], 16)
    except OSError:
        return True
    held: set[int] = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and int(_stat_fields((entry / "stat").read_text())[2]) == pgid:
                held |= {sockets.get(os.readlink(fd), 0) for fd in (entry / "fd").iterdir()}
    return set(ports) <= held


def group_alive(pgid: int) -> bool:
    """True while a process group with this id has a member."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
