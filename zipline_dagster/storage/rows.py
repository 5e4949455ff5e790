"""Rows on their way into a table: a frame as one day's arrow table, and how its
columns differ from the table's."""

from __future__ import annotations

from typing import Any

from zipline_dagster.storage.days import DAY


def day_arrow(frame: Any, ds: str) -> Any:
    """``frame`` (pandas or arrow) as an arrow table of day ``ds``: a string ``ds`` column
    (added when absent) and microsecond timestamps."""
    import pyarrow as pa

    arrow = (
        frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
    )
    if DAY in arrow.column_names:
        arrow = arrow.drop_columns([DAY])
    arrow = arrow.append_column(DAY, pa.array([ds] * arrow.num_rows, pa.string()))
    fields = []
    for f in arrow.schema:
        if pa.types.is_timestamp(f.type) and f.type.unit != "us":
            f = f.with_type(pa.timestamp("us", tz=f.type.tz))
        fields.append(f)
    return arrow.cast(pa.schema(fields), safe=False)


def schema_problems(table_schema: Any, file_schema: Any) -> list[str]:
    """How ``file_schema``'s columns differ from the table's (arrow schemas); [] when
    they match (string and large string, binary and large binary count the same)."""
    import pyarrow as pa

    def norm(t: Any) -> str:
        if pa.types.is_large_string(t):
            t = pa.string()
        if pa.types.is_large_binary(t):
            t = pa.binary()
        return str(t)

    have = {f.name: norm(f.type) for f in table_schema}
    new = {f.name: norm(f.type) for f in file_schema}
    problems = []
    if missing := sorted(set(have) - set(new)):
        problems.append(f"missing {', '.join(missing)}")
    if extra := sorted(set(new) - set(have)):
        problems.append(f"not in the table: {', '.join(extra)}")
    for name in sorted(set(have) & set(new)):
        if have[name] != new[name]:
            problems.append(f"{name} is {new[name]}, the table's is {have[name]}")
    return problems
