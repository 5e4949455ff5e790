"""Dagster's private modules are used in one place: ``zipline_dagster.lineage.internals``.

Each name it takes from ``dagster._core`` / ``dagster._daemon`` is imported here, so a
Dagster upgrade that moves one fails this test (not a user's run); and no other module
of the library reaches into a private Dagster module."""

import ast
import importlib
from pathlib import Path

import zipline_dagster
from zipline_dagster.lineage import internals

LIBRARY = Path(zipline_dagster.__file__).parent
PRIVATE = ("dagster._core", "dagster._daemon")


def _private_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every import from a private Dagster module in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PRIVATE):
            out += [(str(node.module), a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith(PRIVATE)]
    return out


def test_every_private_name_the_library_uses_still_exists() -> None:
    used = _private_imports(Path(internals.__file__))
    assert len(used) >= 10  # the backfill launcher and driver, tags, errors, types
    for module, name in used:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} moved"
    for name in internals.__all__:
        assert getattr(internals, name) is not None


def test_the_backfill_daemon_reads_its_interval_at_each_pass() -> None:
    """``run_daemon`` sets ``DEFAULT_DAEMON_INTERVAL_SECONDS``: the backfill loop must read
    it from the controller module at each pass (it does, imported inside the loop)."""
    import inspect

    from dagster._daemon import backfill, controller

    assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 30
    loop = inspect.getsource(backfill.execute_backfill_iteration_loop)
    assert "from dagster._daemon.controller import DEFAULT_DAEMON_INTERVAL_SECONDS" in loop
    assert "DEFAULT_DAEMON_INTERVAL_SECONDS - loop_duration" in loop


def test_no_other_module_imports_a_private_dagster_module() -> None:
    offenders = {
        str(path.relative_to(LIBRARY)): found
        for path in sorted(LIBRARY.rglob("*.py"))
        if path.name != "internals.py" and (found := _private_imports(path))
    }
    assert offenders == {}


def test_a_plan_run_here_and_interrupted_raises_keyboard_interrupt() -> None:
    """Ctrl-C while ``execute_plan_in_process`` runs a step (a real SIGINT to this
    process) surfaces as the interrupt it is, for the demo to say what stays, not as a
    step failure; a step that fails on its own is still a RuntimeError naming it."""
    import os
    import signal
    import time

    import dagster as dg
    import pytest

    from zipline_dagster.lineage.backfill import Plan

    @dg.asset(partitions_def=dg.DailyPartitionsDefinition(start_date="2026-07-01"))
    def numbers(context: dg.AssetExecutionContext) -> None:
        if context.partition_key == "2026-07-02":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # interrupted before it ends
        raise ValueError("no numbers today")

    defs = dg.Definitions(assets=[numbers])
    instance = dg.DagsterInstance.ephemeral()
    quiet = lambda _: None  # noqa: E731
    for day, raised, text in [
        ("2026-07-02", KeyboardInterrupt, "numbers 2026-07-02"),
        ("2026-07-03", RuntimeError, "numbers 2026-07-03 failed: ValueError: no numbers"),
    ]:
        plan = Plan(steps=[(dg.AssetKey("numbers"), [day])])
        with pytest.raises(raised, match=text):
            internals.execute_plan_in_process(defs, instance, plan, log=quiet)
