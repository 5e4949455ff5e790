"""How `make test` splits the suite over its pytest-xdist workers: each worker is given
whole units, a test module (so its module fixtures start once) or the whole cluster
package (one topology serves it, on fixed ports: Spark's 7077). The units that take
minutes start first, so that no worker ends the run with one of them alone.

Not ``--dist loadgroup``: pytest-xdist 3.8 marks a group by rewriting ``item._nodeid``,
which pytest 9 no longer reads, so its groups are silently ignored; a package fixture
then started once per worker. ``tests/test_xdist_scheduler.py`` pins the behaviour."""

from __future__ import annotations

from typing import Any

import pytest

#: The units that take minutes, longest first (their times in `make test`'s durations);
#: the others follow, the ones with most tests first.
LONGEST = (
    "tests/cluster",
    "tests/ui/test_dagster_ui.py",
    "tests/defs/test_first_model.py",
    "tests/tracking/test_mlflow.py",
    "tests/training/test_distributed.py",
    "tests/rollout/test_champion.py",
)


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/cluster" if path.startswith("tests/cluster/") else path


def order(items: list[pytest.Item]) -> None:
    """Collection order is the order units are handed out: `LONGEST` first."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)

    def rank(unit: str) -> tuple[int, int]:
        return (LONGEST.index(unit) if unit in LONGEST else len(LONGEST), -len(units[unit]))

    items[:] = [item for unit in sorted(units, key=rank) for item in units[unit]]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # the order is `order`'s
    return ByUnit(config, log)
