"""One shape for a partition committed on storage, whatever kind it is.

A table or scores day is committed by an Iceberg snapshot (``storage.tables``), a model
partition by its ``_MANIFEST.json`` (``storage.artifacts``). Each names its write (a
table day's write id, from its snapshot's summary; a model partition's attempt id), the Dagster run that made it, when, and the code version that
wrote it. The ledger (``lineage.ledger``) compares these with Dagster's records.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The kinds of partition the platform commits.
TABLE = "table"
MODEL = "model"


@dataclass(frozen=True)
class Commit:
    """A partition as storage holds it committed."""

    #: ``TABLE`` (a table or scores day) or ``MODEL`` (a model partition)
    kind: str
    partition: str
    #: the partition's folder (a table day's: its data folder in the table)
    uri: str
    #: the write that committed it (a write id, or a model's attempt id); None for a table
    #: day written outside the platform (no marker, or one naming no write)
    write: str | None
    #: the Dagster run that made it (None: written outside a run)
    run_id: str | None = None
    #: when it was committed (seconds since the epoch)
    at: float | None = None
    #: the code version that wrote it (a producer's declaration version, a model's)
    code_version: str | None = None
    #: a model partition's trainer version (its manifest's ``version``)
    version: str | None = None
    #: a table day's Iceberg table (``dagster/table_name`` in the materialization)
    table: str | None = None
