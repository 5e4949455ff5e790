"""The benchmarks' bookkeeping (part of `make test`, not a benchmark): a case whose run
cannot judge its goal says so in the table and in docs/benchmarks.md, never "met"."""

from __future__ import annotations

from dataclasses import asdict

from tests.bench.record import Case, Series, summary_table
from tests.bench.report import render


def case(disturbed: str | None) -> Case:
    return Case(
        name="fan-out",
        baseline=Series("serial loop", [60.0, 61.0, 64.0]),
        measured=Series("Ray", [31.0, 32.0, 38.0]),
        goal=">= 1.8x",
        value=61.0 / 32.0,
        value_text="speed-up 1.91x",
        met=True,
        notes=["fan-out alone: ..."],
        disturbed=disturbed,
    )


def test_a_disturbed_run_is_not_judged_whatever_its_ratio() -> None:
    why = "the slots together trained 2.07x the loop's models per second"
    judged, disturbed = case(None), case(why)
    assert judged.verdict == "met"
    assert disturbed.verdict == "**disturbed** (not judged)"
    table = summary_table([disturbed])
    assert table.splitlines()[-1].endswith("| **disturbed** (not judged) |")
    doc = render(
        {
            "date": "2026-12-01",
            "machine": "x86_64, 2 CPUs",
            "bench_seconds": 60.0,
            "table": table,
            "cases": [{**asdict(disturbed), "verdict": disturbed.verdict}],
        }
    )
    assert f"  - **disturbed, not judged**: {why}\n" in doc
    assert "| met |" not in doc


def test_the_benchmarks_time_the_products_spark_jvm() -> None:
    """The suite's Spark JVMs compile with C1 only (tests/conftest.py), the benchmarks'
    do not: a benchmark times what a user runs (this package's own fixture takes the
    flag off, and Spark reads SPARK_SUBMIT_OPTS when it starts a JVM)."""
    import os

    from tests.conftest import C1_ONLY, SUBMIT_OPTS

    assert C1_ONLY not in os.environ.get(SUBMIT_OPTS, "").split()
