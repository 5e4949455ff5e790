"""pyiceberg's private attributes are used in one place:
``zipline_dagster.storage.iceberg_internals``. These tests fail when a pyiceberg upgrade
moves what it relies on, or when the cache it adds stops being correct."""

import ast
from pathlib import Path

import pandas as pd
import pytest
from pyiceberg.table import Transaction
from pyiceberg.table import update as pyiceberg_update

import zipline_dagster
from tests.helpers import tables_of
from zipline_dagster.storage import iceberg_internals

LIBRARY = Path(zipline_dagster.__file__).parent


def test_the_transaction_still_keeps_what_the_cache_is_keyed_on(tmp_path: Path) -> None:
    """The cache reads ``_table`` and ``_updates`` and rebuilds with
    ``update_table_metadata``; staging an update rebinds ``_updates`` (a tuple)."""
    tables = tables_of((tmp_path / "wh").as_uri())
    tables.write_frame("t.a", "2026-07-01", pd.DataFrame({"x": [1]}))
    table = tables.load("t.a")
    tx = iceberg_internals.transaction(table)
    assert isinstance(tx, Transaction)
    assert tx._table is table and tx._updates == ()
    before = tx._updates
    tx.set_properties({"k": "v"})
    assert tx._updates is not before and isinstance(tx._updates, tuple)
    assert callable(pyiceberg_update.update_table_metadata)
    assert isinstance(Transaction.__dict__["table_metadata"], property)


def test_staged_metadata_is_computed_once_per_staged_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A day's commit (a delete, ``add_files``) rebuilds the staged metadata a few times,
    not once per read (pyiceberg 0.12 read it ~38 times a commit, each a deep copy of
    every snapshot); what a read returns still follows what was staged."""
    tables = tables_of((tmp_path / "wh").as_uri())
    for ds in ("2026-07-01", "2026-07-02"):
        tables.write_frame("t.a", ds, pd.DataFrame({"x": [1]}))
    real = pyiceberg_update.update_table_metadata
    calls: list[int] = []

    def counted(*args, **kwargs):  # a spy: the real function, counted
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(iceberg_internals, "update_table_metadata", counted)
    tables.write_frame("t.a", "2026-07-01", pd.DataFrame({"x": [2]}))
    assert 0 < len(calls) <= 8, f"the staged metadata was rebuilt {len(calls)} times"
    got = tables.days("t.a")
    assert sorted(got) == ["2026-07-01", "2026-07-02"]

    tx = iceberg_internals.transaction(tables.load("t.a"))
    first = tx.table_metadata
    assert tx.table_metadata is first  # unchanged state: the same metadata
    tx.set_properties({"zipline.test": "1"})
    assert tx.table_metadata.properties.get("zipline.test") == "1"  # staged: rebuilt
    assert "zipline.test" not in first.properties


def test_no_other_module_reaches_into_pyiceberg_privates() -> None:
    """Only ``iceberg_internals`` subclasses pyiceberg's ``Transaction`` or touches its
    ``_updates`` / ``_table``."""
    for path in LIBRARY.rglob("*.py"):
        if path.name == "iceberg_internals.py":
            continue
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("_updates", "_metadata_cache"):
                pytest.fail(f"{path.relative_to(LIBRARY)} reads pyiceberg's {node.attr}")
        assert ".transaction()" not in text, (
            f"{path.relative_to(LIBRARY)} opens pyiceberg's own transaction; use "
            "iceberg_internals.transaction"
        )
