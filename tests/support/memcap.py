"""A memory cap for one test process: a memory cgroup of its own under this process's,
whose limit the kernel enforces on the resident memory (and page cache) of what runs in
it: past the limit the process's pages are reclaimed, then it is OOM-killed. cgroup v2
(``memory.max``) or v1 (``memory.limit_in_bytes``), whichever this machine mounts.
Address-space limits (``RLIMIT_AS``, ``RLIMIT_DATA``) are no such cap: Arrow's and
xgboost's allocators reserve address space several times the memory they touch."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

_count = itertools.count()


def _own_memory_cgroup() -> tuple[Path, str]:
    """This process's memory cgroup folder and the version it is (``v1`` or ``v2``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "v1"
        if hierarchy == "0" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            v2 = Path("/sys/fs/cgroup") / path.lstrip("/")
            if "memory" in (v2 / "cgroup.controllers").read_text().split():
                return v2, "v2"
    raise RuntimeError("this machine mounts no memory cgroup: a memory cap cannot be set")


class MemoryCap:
    """A cgroup capped at ``limit`` bytes; ``enter`` (a ``preexec_fn``) puts the child
    process in it; ``peak`` is the most it held; ``close`` removes it."""

    def __init__(self, limit: int) -> None:
        parent, self.version = _own_memory_cgroup()
        self.path = parent / f"zd-cap-{os.getpid()}-{next(_count)}"
        self.path.mkdir()
        self.limit = limit
        if self.version == "v1":
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
        else:
            (self.path / "memory.max").write_text(str(limit))
            (self.path / "memory.swap.max").write_text("0")

    def enter(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    @property
    def peak(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        return int((self.path / name).read_text())

    @property
    def oom_kills(self) -> int:
        """How many times the kernel killed a process of this cgroup for its limit."""
        if self.version == "v1":
            text = (self.path / "memory.oom_control").read_text()
        else:
            text = (self.path / "memory.events").read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def close(self) -> None:
        self.path.rmdir()  # its processes have ended: the test waited for them
