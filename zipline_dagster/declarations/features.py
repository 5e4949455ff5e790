"""Chronon-style declarations of the producers upstream of a model.

Each producer emits exactly one named table ``ns.name`` in the warehouse, one Hive
partition per day, and is turned into a daily-partitioned Dagster asset computed on
Spark (see ``feature_assets.py``). Plain Python, validated at construction.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from zipline_dagster.declarations.model import ModelSpecError, Query, Window

_TABLE = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_table(kind: str, table: object) -> None:
    if not isinstance(table, str) or not _TABLE.match(table):
        raise ModelSpecError(
            f"{kind}.table={table!r} is invalid; expected 'namespace.name' in lower case "
            "(letters, digits, underscores): it names the folder {warehouse}/namespace/name"
        )


class Operation(enum.Enum):
    COUNT = "count"
    SUM = "sum"
    AVERAGE = "avg"
    MIN = "min"
    MAX = "max"
    LAST = "last"


@dataclass(frozen=True)
class Aggregation:
    """``operation`` over ``input_column`` for each window, e.g. clicks summed over 1d and 7d."""

    input_column: str
    operation: Operation
    windows: Sequence[Window] = (Window(1),)

    def __post_init__(self) -> None:
        if not _COLUMN.match(self.input_column):
            raise ModelSpecError(
                f"Aggregation.input_column={self.input_column!r} is not a column name"
            )
        if not self.windows:
            raise ModelSpecError(f"Aggregation on {self.input_column!r}: windows must not be empty")

    def output_columns(self) -> list[tuple[str, int]]:
        """[(column name, window days)], Chronon naming: ``{col}_{op}_{n}d``."""
        return [
            (f"{self.input_column}_{self.operation.value}_{w.days}d", w.days) for w in self.windows
        ]


@dataclass(frozen=True)
class EventTable:
    """A producer's input: a daily-partitioned table of events and the columns to use.

    ``query.selects`` maps output column -> Spark SQL expression; ``time_column`` orders
    events for ``LAST``.
    """

    table: str
    query: Query = field(default_factory=Query)
    time_column: str = "ts"

    def __post_init__(self) -> None:
        _check_table("EventTable", self.table)


@dataclass(frozen=True)
class GroupBy:
    """Windowed aggregations of an event table keyed by an entity.

    Partition ``ds`` holds, for every key seen in the longest window, each aggregation
    over the events of days ``ds-(n-1)..ds``.

    Args:
        name: the producer's name (its asset's description names it).
        table: the ``namespace.name`` it writes.
        source: the event table it aggregates (``EventTable``).
        keys: the entity columns it groups by.
        aggregations: what it computes (``Aggregation``: an operation over a column for
            each window).
        description: shown in the Dagster UI.

    Example:
        ``GroupBy(name="listing_features_v1", table="ctr.listing_features_v1",
        source=EventTable(table="ctr.listing_views", time_column="ts"),
        keys=["listing_id"], aggregations=[Aggregation("clicked", Operation.SUM,
        [Window(1), Window(7)])])``
    """

    name: str
    table: str
    source: EventTable
    keys: Sequence[str]
    aggregations: Sequence[Aggregation]
    description: str = ""

    def __post_init__(self) -> None:
        _check_table(f"GroupBy {self.name!r}", self.table)
        if not self.keys:
            raise ModelSpecError(f"GroupBy {self.name!r}: keys must name at least one column")
        if not self.aggregations:
            raise ModelSpecError(f"GroupBy {self.name!r}: aggregations must not be empty")
        names = [c for a in self.aggregations for c, _ in a.output_columns()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ModelSpecError(
                f"GroupBy {self.name!r}: aggregations produce duplicate columns {dupes}"
            )

    @property
    def lookback_days(self) -> int:
        return max(w for a in self.aggregations for _, w in a.output_columns())

    @property
    def feature_columns(self) -> list[str]:
        return [c for a in self.aggregations for c, _ in a.output_columns()]

    @property
    def upstream_tables(self) -> list[str]:
        return [self.source.table]


@dataclass(frozen=True)
class JoinPart:
    group_by: GroupBy
    #: left column -> group-by key column; default: same names
    key_mapping: Mapping[str, str] | None = None
    prefix: str = ""


@dataclass(frozen=True)
class Join:
    """Left rows of day ``ds`` joined to each GroupBy's features as of the end of
    ``ds-1``: computed only from events strictly before the row's day, so nothing from
    the future (or from the row's own day, labels included) can leak in.

    Args:
        name: the producer's name.
        table: the ``namespace.name`` it writes.
        left: the rows (``EventTable``), one output row each.
        right_parts: the GroupBys joined to them (``JoinPart``, with a key mapping when
            the names differ); at least one.
        description: shown in the Dagster UI.

    Example:
        ``Join(name="training_v1", table="ctr.training_v1",
        left=EventTable(table="ctr.labels_v1"),
        right_parts=[JoinPart(group_by=listing_features)])``
    """

    name: str
    table: str
    left: EventTable
    right_parts: Sequence[JoinPart]
    description: str = ""

    def __post_init__(self) -> None:
        _check_table(f"Join {self.name!r}", self.table)
        if not self.right_parts:
            raise ModelSpecError(f"Join {self.name!r}: right_parts must not be empty")

    @property
    def upstream_tables(self) -> list[str]:
        return [self.left.table, *(p.group_by.table for p in self.right_parts)]


@dataclass(frozen=True)
class StagingQuery:
    """A Spark SQL template producing a table (e.g. labels).

    ``{{ ds }}``, ``{{ start_date }}`` and ``{{ end_date }}`` are filled in; tables named in
    ``dependencies`` may be referred to by their ``ns.name`` in the SQL. The query must
    return a ``ds`` column: each day of the range is written to its own partition. With
    ``lookback_days`` the dependencies' partitions that far back are read too.

    Args:
        name: the producer's name.
        table: the ``namespace.name`` it writes.
        query: the Spark SQL template.
        dependencies: the tables it reads, by ``namespace.name``.
        lookback_days: how many days before the range it reads of them.
        description: shown in the Dagster UI.

    Example:
        ``StagingQuery(name="labels_v1", table="ctr.labels_v1", query="SELECT view_id,
        clicked AS label, ds FROM ctr.listing_views WHERE ds BETWEEN '{{ start_date }}'
        AND '{{ end_date }}'", dependencies=["ctr.listing_views"])``
    """

    name: str
    table: str
    query: str
    dependencies: Sequence[str]
    lookback_days: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        _check_table(f"StagingQuery {self.name!r}", self.table)
        for dep in self.dependencies:
            _check_table(f"StagingQuery {self.name!r} dependency", dep)
        if "{{" in self.query.replace("{{ ds }}", "").replace("{{ start_date }}", "").replace(
            "{{ end_date }}", ""
        ):
            raise ModelSpecError(
                f"StagingQuery {self.name!r}: unknown template variable; accepted: "
                "{{ ds }}, {{ start_date }}, {{ end_date }}"
            )

    @property
    def upstream_tables(self) -> list[str]:
        return list(self.dependencies)

    def render(self, *, start_date: str, end_date: str, table_views: Mapping[str, str]) -> str:
        sql = (
            self.query.replace("{{ start_date }}", start_date)
            .replace("{{ end_date }}", end_date)
            .replace("{{ ds }}", end_date)
        )
        for table, view in table_views.items():
            sql = re.sub(rf"(?<![\w.`]){re.escape(table)}(?![\w])", view, sql)
        return sql


Producer = GroupBy | Join | StagingQuery


def output_columns(producer: Producer) -> list[str] | None:
    """The columns a producer's table has, where its declaration fixes them; else None.

    A GroupBy emits its keys and features; a Join its left selects and each part's
    (prefixed) features; a StagingQuery the columns and aliases of its select list
    (``select_list_columns``; unknown for ``*`` or an unaliased expression). ``ds`` is
    the partition column of every table.
    """
    if isinstance(producer, GroupBy):
        return [*producer.keys, *producer.feature_columns, "ds"]
    if isinstance(producer, Join):
        left = list(producer.left.query.selects)
        if not left:
            return None  # every column of the left table: not known statically
        right = [f"{p.prefix}{c}" for p in producer.right_parts for c in p.group_by.feature_columns]
        return [*left, *right, *(["ds"] if "ds" not in left else [])]
    return select_list_columns(producer.query)


_SELECT_RE = re.compile(r"^\s*SELECT\s+(?P<items>.*?)\s+FROM\s", re.IGNORECASE | re.DOTALL)
_ITEM_RE = re.compile(
    r"^(?:(?:[A-Za-z_][A-Za-z0-9_]*\.)?(?P<column>[A-Za-z_][A-Za-z0-9_]*)"
    r"|.+?\s+AS\s+(?P<alias>[A-Za-z_][A-Za-z0-9_]*))$",
    re.IGNORECASE | re.DOTALL,
)


def select_list_columns(sql: str) -> list[str] | None:
    """The output columns of a StagingQuery's ``SELECT a, t.b, expr AS c ... FROM``, when
    every item is a column or aliased; None when they are not known without Spark
    (``*``, an unaliased expression, a ``WITH`` or ``DISTINCT`` query)."""
    found = _SELECT_RE.match(sql)
    if found is None:
        return None
    items, depth, start = [], 0, 0
    text = found.group("items")
    for i, ch in enumerate(text):  # top-level commas only: f(a, b) AS c is one item
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    out = []
    for item in items:
        m = _ITEM_RE.match(item)
        if m is None or item.upper().startswith("DISTINCT "):
            return None
        out.append(m.group("alias") or m.group("column"))
    return out
