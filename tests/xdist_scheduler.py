"""How `make test` splits the suite over its pytest-xdist workers: each worker is given
whole units, a test module (so its module fixtures start once) or the whole cluster
package (one topology serves it, on fixed ports: Spark's 7077).

Not ``--dist loadgroup``: pytest-xdist 3.8 marks a group by rewriting ``item._nodeid``,
which pytest 9 no longer reads, so its groups are silently ignored; a package fixture
then started once per worker. ``tests/test_xdist_scheduler.py`` pins the behaviour."""

from __future__ import annotations

from typing import Any

import pytest


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/cluster" if path.startswith("tests/cluster/") else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)
