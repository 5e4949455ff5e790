"""Tables on an object store far away: 30 days of one file each on a real S3 server on
loopback (moto), behind a proxy that holds every request for 20 ms (an object store's
first-byte time). Requests one at a time (as before) against several at a time, in the
same run, for what every step and every trainer does with a table:

- the fan-out trainer opens its window with a projection (the table's Iceberg metadata,
  each file's footer), then reads its segment and label columns, then its features.

The server runs for this module only: on 2 cores an idle emulator is not free, and the
Ray cases need both."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from zipline_runtime import trainer_io as tio

from tests.bench.record import Case, Series, record
from tests.conftest import _fresh_bucket, moto_server
from tests.helpers import days_ending, s3_through_proxy, write_partition
from tests.support.fanout import market_rows
from tests.support.training import DS, TABLE

pytestmark = [pytest.mark.bench]
REPEATS = 3
DAYS = 30
LATENCY = 0.020
ROWS = 2000


def fresh_s3_clients() -> None:
    """New S3 clients from the environment as it is now (fsspec keeps one per settings)."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def distant_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The warehouse (an ``s3://`` URI) holding the table, every request to it 20 ms."""
    recording = tmp_path_factory.mktemp("moto") / "recording.jsonl"
    with moto_server(recording) as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        fresh_s3_clients()
        base = f"s3://{_fresh_bucket('s3', env)}/wh"
        for ds in days_ending(DS, DAYS):  # written straight to the server
            write_partition(base, TABLE, ds, market_rows(ds, 50, ROWS // 50))
        with s3_through_proxy(latency=LATENCY):
            yield base


def compare(
    monkeypatch: pytest.MonkeyPatch,
    setting: tuple[object, str],
    run: Callable[[], None],
    name: str,
    note: Callable[[int], str],
) -> None:
    """Records ``run`` with ``setting`` (a module and its concurrency constant) at 1 and
    at its default, interleaved, ``REPEATS`` times each, as the case ``name`` (on S3
    ``LATENCY`` away) with ``note(default)``."""
    module, constant = setting
    default = int(getattr(module, constant))
    times: dict[int, list[float]] = {1: [], default: []}
    for _ in range(REPEATS):  # interleaved, so drift hits both alike
        for concurrent in times:
            monkeypatch.setattr(module, constant, concurrent)
            t0 = time.perf_counter()
            run()
            times[concurrent].append(time.perf_counter() - t0)
    one, many = times.values()
    serial = Series("one request at a time", one)
    spread = Series(f"{default} at a time", many)
    speedup = serial.median / spread.median
    record(
        Case(
            name=name.format(days=DAYS, ms=f"{LATENCY * 1000:.0f}"),
            baseline=serial,
            measured=spread,
            goal="informational",
            value=speedup,
            value_text=f"{speedup:.1f}x faster",
            met=None,
            notes=[note(default)],
        )
    )


def test_training_window_on_a_distant_object_store(
    distant_s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    days = days_ending(DS, DAYS)

    def window() -> None:
        files = tio.WindowFiles(distant_s3, TABLE, days, "ds", ["market", "label", "price"])
        rows = len(files.read_table(["market", "label"], ("market",)))
        rows += len(files.read_table(["price"]))
        assert rows == 2 * DAYS * ROWS

    compare(
        monkeypatch,
        (tio, "CONCURRENT_REQUESTS"),
        window,
        "training window of {days} days on S3 {ms} ms away: open with a projection, then "
        "two reads (the fan-out trainer)",
        lambda n: (
            f"{DAYS} files of {ROWS:,} rows, {n} requests at a time; the table's Iceberg "
            "metadata (the projection checked against its schema), then 5 requests a file: a "
            "HEAD and a GET per read, and its footer's GET with the first"
        ),
    )
