"""`make test`'s two workers run whole modules, and the cluster package as one unit, first: a
real pytest-xdist run of a small suite shaped like ours (tests/xdist_scheduler.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_a_package_fixture_starts_once_and_a_module_stays_on_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "tests"
    (suite / "cluster").mkdir(parents=True)
    (suite / "app").mkdir()  # collected before the cluster package
    (suite / "conftest.py").write_text(
        "from tests.xdist_scheduler import order, pytest_xdist_make_scheduler  # noqa: F401\n"
        "def pytest_collection_modifyitems(items):\n"
        "    order(items)\n"
    )
    log = tmp_path / "log"
    (suite / "cluster" / "conftest.py").write_text(
        "import pytest\n"
        "@pytest.fixture(scope='package')\n"
        "def topology():\n"
        f"    open({str(log)!r}, 'a').write('topology started\\n')\n"
    )
    record = (
        "import os\n"
        "def record(name):\n"
        f"    open({str(log)!r}, 'a').write(f'{{name}} {{os.getpid()}}\\n')\n"
    )
    for module in ("test_a", "test_b"):
        (suite / "cluster" / f"{module}.py").write_text(
            record + "".join(f"def test_{i}(topology): record('{module}')\n" for i in range(2))
        )
    for module in ("test_x", "test_y", "test_z"):
        (suite / "app" / f"{module}.py").write_text(
            "import time\n"
            + record
            + "".join(f"def test_{i}(): time.sleep(0.2); record('{module}')\n" for i in range(4))
        )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = log.read_text().splitlines()
    assert lines.count("topology started") == 1, lines
    workers: dict[str, set[str]] = {}
    for line in lines:
        if line != "topology started":
            module, pid = line.split()
            workers.setdefault("cluster" if module in ("test_a", "test_b") else module, set()).add(
                pid
            )
    assert set(workers) == {"cluster", "test_x", "test_y", "test_z"}
    assert all(len(pids) == 1 for pids in workers.values()), workers
    assert len(set().union(*workers.values())) == 2  # both workers had work
    # the longest unit is handed out first, though it has fewer tests than each module
    (pid,) = workers["cluster"]
    first = next(line for line in lines if line.endswith(f" {pid}"))
    assert first.split()[0] in ("test_a", "test_b"), lines
