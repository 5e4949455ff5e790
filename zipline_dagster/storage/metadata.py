"""What Dagster records of a committed table day: Dagster's standard table metadata
(``dagster/table_name``, ``dagster/column_schema``, ``dagster/row_count``) and the
Iceberg snapshot, the write and the path the ledger compares with the catalog."""

from __future__ import annotations

from typing import Any

import dagster as dg

from zipline_dagster.storage.table_days import TableDay
from zipline_dagster.storage.tables import SNAPSHOT_ID, TABLE_NAME, WRITE_ID, Tables


def column_schema(tables: Tables, table: str) -> dg.TableSchema | None:
    """The table's columns as Dagster shows them (None when the table does not exist)."""
    found = tables.load(table)
    if found is None:
        return None
    return dg.TableSchema(
        columns=[
            dg.TableColumn(f.name, str(f.field_type), description=f.doc)
            for f in found.schema().fields
        ]
    )


def day_metadata(
    day: TableDay, schema: dg.TableSchema | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The materialization metadata of a committed table day."""
    md: dict[str, Any] = {
        TABLE_NAME: dg.MetadataValue.text(day.table),
        "dagster/row_count": dg.MetadataValue.int(day.rows),
        "rows": dg.MetadataValue.int(day.rows),
        SNAPSHOT_ID: dg.MetadataValue.text(day.data_version),
        WRITE_ID: dg.MetadataValue.text(str(day.write)),
        "path": dg.MetadataValue.path(day.uri),
        **(extra or {}),
    }
    if schema is not None:
        md["dagster/column_schema"] = dg.MetadataValue.table_schema(schema)
    return md
