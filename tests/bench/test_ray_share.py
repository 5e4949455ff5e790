"""The fan-out bench's sampler of Ray's own CPU: real processes under a root process, one
spinning as "training", another either sleeping or spinning, and the share of the rest
measured while the training one ran. It reads the machine's cores, so it runs where the
benchmarks run (`make bench`, on a machine nothing else loads), not beside `make test`'s
other worker."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.bench.ray_share import RayShare

pytestmark = pytest.mark.bench

SPIN = "import time\nend = time.monotonic() + 6\nwhile time.monotonic() < end: pass"
SLEEP = "import time; time.sleep(6)"


def tree(rest: str) -> subprocess.Popen[bytes]:
    """A root process whose two children run for 6 s (a slow start under load still
    leaves most of the sampled window): one spinning, tagged as training
    by its command line, and one running ``rest``."""
    root = (
        "import subprocess, sys\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {SPIN!r}, 'zz-training']),\n"
        f"        subprocess.Popen([sys.executable, '-c', {rest!r}, 'zz-other'])]\n"
        "for k in kids: k.wait()\n"
    )
    return subprocess.Popen([sys.executable, "-c", root])


def sampled(rest: str, tag: str = "zz-training", seconds: float = 5.0) -> RayShare:
    """The sampler of a ``tree(rest)`` run for ``seconds``, counting as training the
    processes whose command line holds ``tag``."""
    proc = tree(rest)
    try:
        sampler = RayShare(proc.pid, training=lambda cmd: tag in cmd).start()
        time.sleep(seconds)
        sampler.stop()
    finally:
        proc.wait(timeout=30)  # its children end on their own after 6 s
    return sampler


def test_the_rest_is_what_the_other_processes_used_while_training_ran() -> None:
    quiet, loud = sampled(SLEEP), sampled(SPIN)
    idle, busy = quiet.while_training(0.5), loud.while_training(0.5)
    assert idle is not None and busy is not None
    assert idle < 0.2  # a sleeping process (and the waiting root) costs next to nothing
    assert busy > 0.5  # a spinning one a core of its own (2 cores here)
    # the whole machine: the spinning trainer's core, plus a core for a spinning rest
    alone, both = quiet.machine_while_training(0.5), loud.machine_while_training(0.5)
    assert alone is not None and both is not None
    assert 0.8 < alone < 1.5
    assert both > 1.6


def test_no_share_without_a_sample_at_the_training_level() -> None:
    sampler = sampled(SLEEP, tag="no such process", seconds=1.0)
    assert sampler.samples  # it sampled ...
    assert sampler.while_training(0.5) is None  # ... but nothing trained
