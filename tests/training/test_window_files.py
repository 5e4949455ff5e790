"""Reading a training window column by column (``WindowFiles``): the fan-out trainer reads
its segment and label columns first, to know how many models there are and start its
workers, and the features after; both reads must be the same rows in the same order, of
the files listed once."""

from __future__ import annotations

import pytest

from tests.helpers import days_ending, write_partition
from tests.training.test_assets import DS, TABLE
from tests.training.test_fanout import market_rows
from zipline_dagster.training.trainer_io import TrainingDataError, WindowFiles

DAYS = days_ending(DS, 3)


def window(base: str, columns: list[str] | None = None) -> WindowFiles:
    return WindowFiles(base, TABLE, DAYS, "ds", columns or [])


def test_reads_of_different_columns_are_the_same_rows_in_the_same_order(file_base: str) -> None:
    for ds in DAYS:
        write_partition(file_base, TABLE, ds, market_rows(ds, 7, 30))
    files = window(file_base)
    head = files.read_table(["market", "label"], ("market",))
    body = files.read_table(["price"])
    whole = window(file_base).read_table()  # one read of everything, for comparison
    assert len(head) == len(body) == len(whole) == 3 * 7 * 30
    assert head.column("market").type.value_type == "string"  # dictionary-encoded
    assert head.column("market").to_pylist() == whole.column("market").to_pylist()
    assert head.column("label").to_pylist() == whole.column("label").to_pylist()
    assert body.column("price").to_pylist() == whole.column("price").to_pylist()
    # each read carries the day of every row (the folder's, a dictionary of the days)
    assert body.column("ds").to_pylist() == whole.column("ds").to_pylist()
    assert sorted(set(whole.column("ds").to_pylist())) == DAYS
    assert files.schema.names == ["market", "price", "noise", "label"]


def test_the_files_are_listed_once(file_base: str) -> None:
    """Both reads are of the files listed when the window was opened: a day written again
    in between (its old files replaced) is an error naming it, never a mix of versions."""
    for ds in DAYS:
        write_partition(file_base, TABLE, ds, market_rows(ds, 3, 10))
    files = window(file_base)
    assert len(files.read_table(["market"])) == 3 * 3 * 10
    write_partition(file_base, TABLE, DAYS[0], market_rows(DAYS[0], 5, 10))  # more rows
    with pytest.raises(TrainingDataError) as err:
        files.read_table(["price"])
    assert f"table {TABLE} partition {DAYS[0]} was written again while this job read it" in str(
        err.value
    )
    assert len(window(file_base).read_table(["price"])) == (5 + 3 + 3) * 10  # a new listing


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


def test_a_day_without_a_column_is_named(file_base: str) -> None:
    for ds in DAYS:
        frame = market_rows(ds, 3, 10)
        write_partition(file_base, TABLE, ds, frame.drop(columns="noise") if ds == DS else frame)
    with pytest.raises(TrainingDataError) as err:
        window(file_base).read_table(["noise"])
    assert (
        f"table {TABLE} partition {DS} has no columns ['noise'] (asked for by the trainer); "
        "it has ['label', 'market', 'price']"
    ) in str(err.value)


def test_missing_days_are_named_before_anything_is_read(file_base: str) -> None:
    write_partition(file_base, TABLE, DAYS[1], market_rows(DAYS[1], 3, 10))
    files = window(file_base)
    for step in (lambda: files.schema, lambda: files.read_table(["market"])):
        with pytest.raises(TrainingDataError) as err:
            step()
        assert f"is missing partitions {DAYS[0]}, {DAYS[2]} of the window" in str(err.value)
