"""The fan-out bench's sign of a host that slowed one of its cores (part of `make test`,
not a benchmark): two processes measured at more than twice one process's speed."""

from __future__ import annotations

from tests.bench.host_pair import uneven_pair


def test_a_pair_faster_than_twice_one_process_says_the_run_was_disturbed() -> None:
    # yesterday's quiet host: 7.00 s alone, 3.80 s as a pair (1.84x)
    assert uneven_pair([7.0, 7.0, 7.28], [3.56, 3.80, 3.81]) is None
    assert uneven_pair([6.0], [3.0]) is None  # exactly twice: 2 processes can
    # 2026-12-03: one repeat at 2.22x, one process slowed by the host
    why = uneven_pair([13.41, 11.79, 11.9], [6.05, 6.08, 6.67])
    assert why is not None
    assert why.startswith("two bare processes trained 1.78-2.22x one process's models")
    assert "run the benchmark again" in why
