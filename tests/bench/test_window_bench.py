"""A training window read from an object store far away: 30 days of one file each on a
real S3 server on loopback (moto), behind a proxy that holds every request for 20 ms (an
object store's first-byte time), read the way the fan-out trainer reads it: opened with
a projection (each day's commit marker, each file's footer), then its segment and label
columns, then its features. The files read one request at a time (as before) against
``CONCURRENT_REQUESTS`` at a time, in the same run.

The server runs for this case only: on 2 cores an idle emulator is not free, and the
Ray cases need both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench.record import Case, Series, record
from tests.conftest import _fresh_bucket, moto_server
from tests.helpers import days_ending, write_partition
from tests.tcp_proxy import TcpProxy
from tests.training.test_assets import DS, TABLE
from tests.training.test_fanout import market_rows
from zipline_dagster.training import trainer_io as tio

pytestmark = [pytest.mark.bench]
REPEATS = 3
DAYS = 30
LATENCY = 0.020


def fresh_s3_clients() -> None:
    """New S3 clients from the environment as it is now (fsspec keeps one per settings)."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


def test_window_on_a_distant_object_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    days = days_ending(DS, DAYS)
    with moto_server(tmp_path / "recording.jsonl") as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        base = f"s3://{_fresh_bucket('s3', env)}/wh"
        for ds in days:  # written straight to the server
            write_partition(base, TABLE, ds, market_rows(ds, 50, 40))
        host, port = env["AWS_ENDPOINT_URL"].removeprefix("http://").split(":")
        proxy = TcpProxy(host, int(port), latency=LATENCY)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        fresh_s3_clients()
        try:

            def read(concurrent: int) -> float:
                import time

                monkeypatch.setattr(tio, "CONCURRENT_REQUESTS", concurrent)
                t0 = time.perf_counter()
                files = tio.WindowFiles(base, TABLE, days, "ds", ["market", "label", "price"])
                rows = len(files.read_table(["market", "label"], ("market",)))
                rows += len(files.read_table(["price"]))
                assert rows == 2 * DAYS * 50 * 40
                return time.perf_counter() - t0

            runs: dict[int, list[float]] = {1: [], tio.CONCURRENT_REQUESTS: []}
            for _ in range(REPEATS):  # interleaved, so drift hits both alike
                for concurrent in runs:
                    runs[concurrent].append(read(concurrent))
        finally:
            proxy.close()
            fresh_s3_clients()
    one, many = runs.values()
    serial = Series("one request at a time", one)
    spread: Any = Series(f"{tio.CONCURRENT_REQUESTS} at a time", many)
    speedup = serial.median / spread.median
    record(
        Case(
            name=f"training window of {DAYS} days on S3 {LATENCY * 1000:.0f} ms away: open "
            "with a projection, then two reads",
            baseline=serial,
            measured=spread,
            goal="informational",
            value=speedup,
            value_text=f"{speedup:.1f}x faster",
            met=None,
            notes=[
                f"{DAYS} files of 2,000 rows; a real S3 server (moto) on loopback behind a "
                f"proxy holding each request {LATENCY * 1000:.0f} ms; 7 requests a day: its "
                "commit marker, a file's footer (HEAD, GET), and a HEAD and a GET per read",
            ],
        )
    )
