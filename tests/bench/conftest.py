"""``make bench``: a Ray head as a user runs one, and after the last case one summary
table (goal and verdict per row)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bench import record
from tests.conftest import C1_ONLY, INSTALL_REQUIREMENTS, SUBMIT_OPTS, running_head

_STARTED = time.perf_counter()


@pytest.fixture(scope="session")
def ray_head(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_session: pytest.MonkeyPatch
) -> Iterator[Any]:
    """The benchmarks' Ray head (2 CPUs, stopped after the session): the test suite's head
    without the storage emulators the suite starts beside it and hands to it (moto, the
    GCS emulator, Azurite). The benchmarks read and write ``file://`` only, and on 2 cores
    an idle emulator is not free: Azurite alone took 0.04-0.07 of a core while a fan-out
    ran, CPU the parallel side needs and the serial loop does not. Jobs install their
    trainer's requirements (Ray's pip env), the default a user gets, which the test suite
    turns off (tests/conftest.py)."""
    monkeypatch_session.setenv(INSTALL_REQUIREMENTS, "true")
    yield from running_head(tmp_path_factory.mktemp("ray"), "Ray head (benchmarks)")


@pytest.fixture(scope="package", autouse=True)
def products_spark_jvm() -> Iterator[None]:
    """The benchmarks time the product's Spark JVM, not the test run's: the C1-only flag
    the suite adds for its small data (tests/conftest.py) is taken off for this package
    (with it, large ranges write several times slower: 37d487d's message)."""
    with pytest.MonkeyPatch.context() as patch:
        opts = [o for o in os.environ.get(SUBMIT_OPTS, "").split() if o != C1_ONLY]
        if opts:
            patch.setenv(SUBMIT_OPTS, " ".join(opts))
        else:
            patch.delenv(SUBMIT_OPTS, raising=False)
        yield


@pytest.fixture(scope="session")
def monkeypatch_session() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


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
