"""Any engine reads the warehouse: plain pyiceberg (``load_catalog`` with the documented
settings) and DuckDB over pyiceberg's arrow scan, in a process that imports nothing of
the platform, return exactly the rows a trainer reads for its window."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from zipline_runtime.trainer_io import WindowFiles

from tests.helpers import ctr_rows, days_ending, local, tables_of, write_partition
from zipline_dagster.storage.table_days import window_snapshot

TABLE = "ctr.training_v1"

READER = textwrap.dedent(
    """
    import json, sys
    import duckdb
    from pyiceberg.catalog import load_catalog

    catalog_uri, table, start, end = sys.argv[1:5]
    found = load_catalog("zipline", type="sql", uri=catalog_uri).load_table(table)
    rows = found.scan(row_filter=f"ds >= '{start}' AND ds <= '{end}'").to_arrow()
    got = duckdb.sql(
        "SELECT ds, listing_id, price_log, label FROM rows ORDER BY ds, listing_id"
    ).fetchall()
    assert not any(m.startswith("zipline_dagster") for m in sys.modules), "platform imported"
    print(json.dumps([list(r) for r in got]))
    """
)


def test_pyiceberg_and_duckdb_read_exactly_the_rows_the_trainer_reads(file_base: str) -> None:
    days = days_ending("2026-07-13", 4)
    for ds in days:
        write_partition(file_base, TABLE, ds, ctr_rows(ds, 50))
    write_partition(file_base, TABLE, days[1], ctr_rows(days[1], 30, seed=1))  # rewritten
    tables = tables_of(file_base)
    metadata, held = tables.state(TABLE)
    assert metadata is not None
    files = WindowFiles(
        file_base,
        TABLE,
        days,
        "ds",
        ["listing_id", "price_log", "label"],
        metadata=metadata,
        snapshot_id=window_snapshot(held, days),
    )
    trainer = files.read_frame().sort_values(["ds", "listing_id"])
    expected = [
        [r.ds, int(r.listing_id), float(r.price_log), int(r.label)]
        for r in trainer.itertuples(index=False)
    ]
    assert len(expected) == 50 + 30 + 50 + 50

    catalog_uri = f"sqlite:///{local(file_base)}/catalog.db"  # the embedded catalog
    out = subprocess.run(
        [sys.executable, "-c", READER, catalog_uri, TABLE, days[0], days[-1]],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == expected
