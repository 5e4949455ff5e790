"""The trainers' storage (``zipline_runtime.trainer_io``). Reading a training window column by
column (``WindowFiles``): the fan-out trainer reads its segment and label columns first,
to know how many models there are and start its workers, and the features after; both
reads must be the same rows in the same order, of the files listed once. Writing
artifacts (``write_bytes``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from zipline_runtime.trainer_io import TrainingDataError, WindowFiles, filesystem

from tests.helpers import days_ending, s3_requests, tables_of, write_partition
from tests.support.fanout import market_rows
from tests.support.training import BUCKETS, DS, TABLE

DAYS = days_ending(DS, 3)


def window(base: str, columns: list[str] | None = None) -> WindowFiles:
    return WindowFiles(base, TABLE, DAYS, "ds", columns or [])


@pytest.mark.parametrize("store", ["file", "s3"])
def test_reads_of_different_columns_are_the_same_rows_in_the_same_order(
    store: str, request: pytest.FixtureRequest
) -> None:
    """Rows come back day by day in the window's order, each day's as written, in every
    read: on a local disk (files read one after another) and on an object store (files
    read several at a time)."""
    import pandas as pd

    base = str(request.getfixturevalue(BUCKETS[store])) + "/wh"
    days = days_ending(DS, 12)
    frames = [market_rows(ds, 7, 30) for ds in days]
    for ds, frame in zip(days, frames, strict=True):
        write_partition(base, TABLE, ds, frame)
    written = pd.concat(frames, ignore_index=True)
    files = WindowFiles(base, TABLE, days, "ds", [])
    head = files.read_table(["market", "label"], ("market",))
    body = files.read_table(["price"])
    assert len(head) == len(body) == 12 * 7 * 30
    assert head.column("market").type.value_type == "string"  # dictionary-encoded
    assert head.column("market").to_pylist() == written["market"].tolist()
    assert head.column("label").to_pylist() == written["label"].tolist()
    assert body.column("price").to_pylist() == written["price"].tolist()
    # each read carries the day of every row (the folder's, a dictionary of the days)
    assert body.column("ds").to_pylist() == [ds for ds in days for _ in range(7 * 30)]
    assert files.schema.names == ["market", "price", "noise", "label"]


@pytest.mark.parametrize("store", ["file", "s3"])
def test_every_read_is_of_the_snapshot_the_window_opened(
    store: str, request: pytest.FixtureRequest
) -> None:
    """Both reads are of the Iceberg snapshot planned when the window was opened: days
    written again in between (new files, in new snapshots) do not reach the second read,
    which returns the same rows as the first; a window opened afresh reads the new days."""
    base = str(request.getfixturevalue(BUCKETS[store])) + "/wh"
    for ds in DAYS:
        write_partition(base, TABLE, ds, market_rows(ds, 3, 10))
    files = window(base)
    assert len(files.read_table(["market"])) == 3 * 3 * 10
    for ds in (DAYS[2], DAYS[0]):
        write_partition(base, TABLE, ds, market_rows(ds, 5, 10))  # more rows
    assert len(files.read_table(["price"])) == 3 * 3 * 10
    assert len(window(base).read_table(["price"])) == (5 + 3 + 5) * 10  # a new snapshot


def test_a_file_rewritten_in_place_between_reads_is_an_error(file_base: str) -> None:
    """A writer that replaces a file under the same name (not the platform's: its file
    names are new on every write) between two reads: the second read is refused, never
    made of the old file's footer and the new file's bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for ds in DAYS:
        write_partition(file_base, TABLE, ds, market_rows(ds, 3, 10))
    files = window(file_base)
    assert len(files.read_table(["market"])) == 3 * 3 * 10
    day, paths = files.days[0]
    pq.write_table(pa.Table.from_pandas(market_rows(day, 5, 10)), paths[0])  # same name
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["price"])
    assert f"table {TABLE} partition {day} was written again while this job read it" in str(
        err.value
    )


def plain_parquet(frame: Any) -> bytes:
    """``frame`` as parquet bytes whose size depends only on its shape and types: no
    compression, no dictionaries, no statistics."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table, sink, compression="NONE", use_dictionary=False, write_statistics=False)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("store", ["file", "s3", "gs", "abfss"])
def test_a_file_rewritten_at_the_same_size_between_reads_is_an_error(
    store: str, request: pytest.FixtureRequest
) -> None:
    """A file replaced under the same name by one of exactly the same size, other values,
    between the read of the labels and the read of the features: the second read is
    refused, never the first version's labels beside the second version's features. The
    version of a file is its local inode and change times, or the object's ETag or
    generation, on real storage servers on loopback."""
    base = str(request.getfixturevalue(BUCKETS[store])) + "/wh"
    for ds in DAYS:
        write_partition(base, TABLE, ds, market_rows(ds, 3, 10))
    listed = window(base)
    day, paths = listed.days[0]
    frame = market_rows(day, 3, 10)
    first = plain_parquet(frame)
    second = plain_parquet(frame.assign(price=frame["price"] + 1.0))
    assert len(first) == len(second) and first != second  # the case under test
    fs = listed.fs
    fs.pipe_file(paths[0], first)
    files = window(base)
    assert len(files.read_table(["market", "label"])) == 3 * 3 * 10
    fs.pipe_file(paths[0], second)
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["price"])
    assert f"table {TABLE} partition {day} was written again while this job read it" in str(
        err.value
    )
    # the same files opened afresh read the second version
    prices = window(base).read_table(["price"]).column("price").to_pylist()[:30]
    assert prices == (frame["price"] + 1.0).tolist()


def test_an_object_rewritten_during_its_read_is_an_error(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object changes after the read opened it (its ETag taken) and before its bytes
    are fetched: the S3 server refuses the ranged reads (If-Match), and the read says the
    day was written again. The rewrite is real, on the loopback server; only its moment
    is chosen, by running it as the read opens the file."""
    base = f"{s3_bucket}/wh"
    for ds in DAYS:
        write_partition(base, TABLE, ds, market_rows(ds, 3, 10))
    files = window(base)
    day, paths = files.days[0]
    opened = files.fs.open

    def open_then_rewrite(path: str, *args: Any, **kwargs: Any) -> Any:
        f = opened(path, *args, **kwargs)
        if path == paths[0]:
            files.fs.pipe_file(path, plain_parquet(market_rows(day, 4, 10)))
        return f

    monkeypatch.setattr(files.fs, "open", open_then_rewrite)
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["price"])
    assert f"table {TABLE} partition {day} was written again while this job read it" in str(
        err.value
    )


def test_a_read_beyond_the_projection_is_refused(file_base: str) -> None:
    for ds in DAYS:
        write_partition(file_base, TABLE, ds, market_rows(ds, 3, 10))
    files = window(file_base, ["price", "label"])
    assert files.schema.names == ["price", "label"]
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["market"])
    assert f"table {TABLE}: columns ['market'] are not read (--columns=price,label)" in str(
        err.value
    )
    with pytest.raises(TrainingDataError, match=r"has no columns \['margin'\] \(--columns\)"):
        window(file_base, ["price", "margin"])


def test_a_column_the_table_lacks_is_named(file_base: str) -> None:
    for ds in DAYS:
        write_partition(file_base, TABLE, ds, market_rows(ds, 3, 10))
    with pytest.raises(TrainingDataError) as err:
        window(file_base).read_table(["noise", "nosie"])
    assert (
        f"table {TABLE} partition {DAYS[0]} has no columns ['nosie'] (asked for by the "
        "trainer); it has ['ds', 'label', 'market', 'noise', 'price']"
    ) in str(err.value)


def test_missing_days_are_named_before_anything_is_read(file_base: str) -> None:
    write_partition(file_base, TABLE, DAYS[1], market_rows(DAYS[1], 3, 10))
    files = window(file_base)
    for step in (lambda: files.schema, lambda: files.read_table(["market"])):
        with pytest.raises(TrainingDataError) as err:
            step()
        assert f"is missing partitions {DAYS[0]}, {DAYS[2]} of the window" in str(err.value)


def test_a_window_costs_its_metadata_and_two_requests_per_file_and_read_on_s3(
    s3_bucket: str, s3_env: dict[str, str]
) -> None:
    """On an object store every request is latency (and money). Opening the window reads
    the table's Iceberg metadata only (the metadata file, its manifest list and the
    manifests holding its days; the platform's --columns is checked against the table's
    schema there): no data file. The first read of a file costs three requests: the
    open's HEAD (which names the version the read must be of), a GET of its footer and
    one of the columns; every read after costs two, never the footer again."""
    base = f"{s3_bucket}/wh"
    for ds in DAYS:  # files larger than the 64 KB a parquet reader takes from the end for
        write_partition(base, TABLE, ds, market_rows(ds, 3, 4000))  # the footer
    metadata = tables_of(base).metadata_location(TABLE)
    names = sorted(path.rsplit("/", 1)[-1] for _, paths in window(base).days for path in paths)
    assert len(names) == len(DAYS)  # one file a day
    endpoint = s3_env["AWS_ENDPOINT_URL"]

    def opened(days: list[str]) -> Counter[tuple[str, str]]:
        with s3_requests(endpoint) as opening:
            WindowFiles(base, TABLE, days, "ds", ["market", "label", "price"], metadata=metadata)
        return Counter(opening)

    one, three = opened(DAYS[:1]), opened(DAYS)
    # the metadata file, its manifest list, and the manifests of the days asked for (a
    # manifest per commit here; pyiceberg skips those whose partitions are not asked for)
    assert all(name.endswith((".metadata.json", ".avro")) for _, name in three)
    assert sum(one.values()) < sum(three.values()) <= 2 * (2 + len(DAYS))
    files = window(base, ["market", "label", "price"])
    with s3_requests(endpoint) as reading:
        assert len(files.read_table(["market", "label"])) == 3 * 3 * 4000
    assert Counter(reading) == Counter(
        {**{("HEAD", name): 1 for name in names}, **{("GET", name): 2 for name in names}}
    )
    for columns in (["market", "label"], ["price"]):
        with s3_requests(endpoint) as reading:
            assert len(files.read_table(columns)) == 3 * 3 * 4000
        assert Counter(reading) == Counter(
            (method, name) for name in names for method in ("HEAD", "GET")
        ), columns


@pytest.mark.parametrize("store", ["file", "s3", "gs", "abfss"])
def test_a_table_another_engine_wrote_is_read_through_its_metadata(
    store: str, request: pytest.FixtureRequest
) -> None:
    """An Iceberg table written with plain pyiceberg (another team's engine: its own
    catalog, its own file names, no platform code): the window reads exactly its days'
    rows; a day it has no data for is missing, named."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    base = str(request.getfixturevalue(BUCKETS[store])) + "/other"
    db = request.getfixturevalue("tmp_path") / "their-catalog.db"
    catalog = SqlCatalog(
        "theirs",
        uri=f"sqlite:///{db}",
        warehouse=base,
        **{"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"},
    )
    catalog.create_namespace("ctr")
    first = pa.Table.from_pandas(market_rows(DAYS[0], 3, 11).assign(ds=DAYS[0]))
    theirs = catalog.create_table(TABLE, schema=first.schema, location=f"{base}/ctr/training_v1")
    with theirs.update_spec() as spec:
        spec.add_identity("ds")
    theirs.append(first)
    theirs.append(pa.Table.from_pandas(market_rows(DAYS[1], 2, 11).assign(ds=DAYS[1])))
    metadata = catalog.load_table(TABLE).metadata_location
    files = WindowFiles(base, TABLE, DAYS, "ds", ["market", "price"], metadata=metadata)
    assert files.missing == [DAYS[2]]
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["price"])
    assert f"is missing partitions {DAYS[2]} of the window {DAYS[0]}..{DAYS[2]}" in str(err.value)
    two = WindowFiles(base, TABLE, DAYS[:2], "ds", ["market", "price"], metadata=metadata)
    table = two.read_table(["market", "price"])
    assert Counter(table.column("ds").to_pylist()) == {DAYS[0]: 3 * 11, DAYS[1]: 2 * 11}


@pytest.mark.parametrize("kind", ["string", "date"])
def test_a_window_is_planned_as_pyicebergs_own_scan_plans_it(
    kind: str, tmp_path: Any, file_base: str
) -> None:
    """The trainer plans a window from the snapshot's manifests itself (a reader kept per
    manifest schema, not pyiceberg's scan): the files it finds for each day are exactly
    those pyiceberg's scan plans, on a table of days appended, overwritten and deleted
    (manifests with deleted entries), whether ``ds`` is a string or a date (another
    team's table)."""
    import datetime as dt

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import In
    from zipline_runtime import trainer_io

    catalog = SqlCatalog("theirs", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=file_base)
    catalog.create_namespace("ctr")
    days = days_ending(DS, 6)

    def rows(ds: str, n: int) -> pa.Table:
        day = dt.date.fromisoformat(ds) if kind == "date" else ds
        return pa.table({"x": list(range(n)), "ds": [day] * n})

    table = catalog.create_table(TABLE, schema=rows(days[0], 1).schema)
    with table.update_spec() as spec:
        spec.add_identity("ds")
    for i, ds in enumerate(days):
        table.append(rows(ds, i + 1))
    table.dynamic_partition_overwrite(rows(days[2], 9))  # a day replaced
    table.append(rows(days[3], 2))  # a day with two files
    table.delete(f"ds == '{days[4]}'" if kind == "string" else In("ds", [days[4]]))
    found = catalog.load_table(TABLE)
    window = days[1:]
    planned = trainer_io.plan_window(found.metadata_location, None, window, "ds").files
    theirs: dict[str, list[str]] = {}
    for task in found.scan(row_filter=In("ds", window)).plan_files():
        value = task.file.partition[0]
        day = (dt.date(1970, 1, 1) + dt.timedelta(days=value)).isoformat() if kind == "date" else value  # fmt: skip
        theirs.setdefault(day, []).append(task.file.file_path)
    assert planned == {d: sorted(f) for d, f in theirs.items()}
    assert days[4] not in planned and len(planned[days[3]]) == 2
    files = WindowFiles(file_base, TABLE, window, "ds", ["x"], metadata=found.metadata_location)
    assert files.missing == [days[4]]
    assert Counter(files.tables(["x"])[1][1][0].column("x").to_pylist()) == Counter(range(9))


@pytest.mark.parametrize("store", ["s3", "gs", "abfss"])
def test_an_artifact_written_to_a_missing_bucket_is_an_error_naming_it(
    store: str, request: pytest.FixtureRequest
) -> None:
    """A trainer writing into a bucket (container) that does not exist, say a mistyped
    one: an error naming the URI, and no bucket made of the typo (s3fs's makedirs would
    create it), on each object store's server on loopback."""
    from zipline_runtime.trainer_io import write_bytes

    existing = str(request.getfixturevalue(BUCKETS[store]))
    scheme, rest = existing.split("://", 1)
    bucket, _, host = rest.partition("@")  # abfss://container@account.host
    typo = f"{scheme}://{bucket}-typo" + (f"@{host}" if host else "")
    uri = f"{typo}/models/m/metrics.json"
    with pytest.raises(FileNotFoundError) as err:
        write_bytes(f"{typo}/models/m", "metrics.json", b"{}")
    assert str(err.value).startswith(f"could not write {uri}: ")
    fs, path = filesystem(typo)
    fs.invalidate_cache()
    assert not fs.exists(path)
    assert write_bytes(f"{existing}/models/m", "metrics.json", b"{}").startswith(existing)
