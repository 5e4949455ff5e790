"""What this project uses of pyiceberg that has no public form, in one place.

``tests/storage/test_iceberg_internals.py`` pins every name used here and fails when a
pyiceberg upgrade moves one; nothing else in the library reaches into pyiceberg's
private attributes (the trainer support's manifest reader, ``zipline_runtime.tables``,
uses public pyiceberg names only).

* ``transaction``: a table's transaction whose metadata is computed once per staged
  state. pyiceberg 0.12's ``Transaction.table_metadata`` replays the staged updates and
  deep-copies the whole metadata (every snapshot) on each read, and a commit of a delete
  plus ``add_files`` reads it about 38 times: a day's commit cost grew with the table's
  history (0.36 s at 300 snapshots, a year of daily commits rewritten three times took
  about 12 minutes to build). The cache is the one apache/iceberg-python#3302 and #3784
  propose (keyed on the identity of the table's metadata and of the staged updates,
  a tuple rebound by every ``_stage``): remove it when a release carries it.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Transaction
from pyiceberg.table.update import update_table_metadata


class _CachedTransaction(Transaction):
    """pyiceberg's ``Transaction`` whose ``table_metadata`` is recomputed only when the
    table's metadata or the staged updates changed (by identity)."""

    _metadata_cache: tuple[Any, Any, Any] | None = None

    @property
    def table_metadata(self) -> Any:
        base, updates = self._table.metadata, self._updates
        cached = self._metadata_cache
        if cached is None or cached[0] is not base or cached[1] is not updates:
            cached = (base, updates, update_table_metadata(base, updates))
            self._metadata_cache = cached
        return cached[2]


def transaction(table: Any) -> Transaction:
    """``table.transaction()``, with the staged metadata computed once per staged state."""
    return _CachedTransaction(table)
