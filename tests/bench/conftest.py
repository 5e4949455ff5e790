"""``make bench``: after the last case, one summary table (goal and verdict per row)."""

from __future__ import annotations

import time

import pytest

from tests.bench import record

_STARTED = time.perf_counter()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not record.cases():
        return
    seconds = time.perf_counter() - _STARTED
    record.write_results(seconds)
    terminalreporter.write_sep("=", "benchmark summary")
    terminalreporter.write_line(record.summary_table())
    terminalreporter.write_line(
        f"({len(record.cases())} cases in {seconds / 60:.1f} min; results in "
        f"{record.RESULTS.relative_to(record.RESULTS.parents[3])})"
    )
