"""Backfills through lineage: what must be (re)computed before a model range trains.

A partition that is missing or stale (``lineage.freshness``) is included, upstream
first; a fresh partition is skipped, so re-running a backfill of a fresh range does
nothing. A partition a run still going committed is left to that run.
"""

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from zipline_dagster.lineage.freshness import (
    BackfillError,
    Freshness,
    FreshnessResolver,
    Kind,
)
from zipline_dagster.lineage.ledger import (
    CODE_VERSION_TAG,
    Ledger,
)
from zipline_dagster.storage.resources import warehouse_of

#: a run in one of these (``DagsterRunStatus`` values, GraphQL's names too) is still going
IN_PROGRESS = frozenset({"QUEUED", "NOT_STARTED", "MANAGED", "STARTING", "STARTED", "CANCELING"})


def plan_done(
    targets: set[tuple[dg.AssetKey, str | None]] | None,
    statuses: list[str],
    made: Callable[[], Iterable[tuple[dg.AssetKey | None, str | None]]],
) -> bool:
    """Whether a backfill has ended with its plan done: a run of it has materialized each
    of its ``targets`` (asset partitions) and none of its runs (``statuses``) is still
    going, e.g. after a failed run's retry; the daemon marks it so only at its next pass,
    up to 30 s later. ``made`` (what its runs materialized) is read only then. The one
    rule of ``backfill --wait``, run here or through a deployment's webserver."""
    return bool(targets and statuses and not set(statuses) & IN_PROGRESS and targets <= set(made()))


class RunFailed(RuntimeError):
    """A run of a plan, run in this process, failed: names its asset and partitions, the
    step's error and the run (whose whole log is in the Dagster UI)."""


@dataclass
class Plan:
    """Asset partitions to materialize, in dependency order, and why each is included."""

    steps: list[tuple[dg.AssetKey, list[str]]] = field(default_factory=list)
    reasons: dict[tuple[dg.AssetKey, str], Freshness] = field(default_factory=dict)
    fresh: list[tuple[dg.AssetKey, str]] = field(default_factory=list)
    #: partitions a run still going committed and has not recorded: left to it, and why
    in_flight: dict[tuple[dg.AssetKey, str], Freshness] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        lines = [
            f"  {key.to_user_string()} {part}: left out, {why}"
            for (key, part), why in self.in_flight.items()
        ]
        if self.empty:
            other = " other" if lines else ""
            return "\n".join([*lines, f"nothing to do: every{other} requested partition is fresh"])
        for key, parts in self.steps:
            full = {self.reasons[(key, p)] for p in parts}
            # one reason is shown whole; several are summed up by kind
            why = [str(*full)] if len(full) == 1 else sorted({str(r.kind) for r in full})
            lines.append(f"  {key.to_user_string()}: {span_text(parts)} ({', '.join(why)})")
        return "\n".join(lines)


def span_text(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{len(parts)} partitions {parts[0]}..{parts[-1]}"


def plan_backfill(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    target: dg.AssetKey,
    partitions: Iterable[str],
    *,
    ledger: Ledger | None = None,
) -> Plan:
    """What to materialize, upstream first, for ``target``'s ``partitions``: every
    missing or stale partition they need. The ledger's rule applies to each partition
    read (``ledger``: with the models' judge, so that one recorded from storage has its
    checks evaluated)."""
    graph = _checked_graph(defs, target)
    warehouse = warehouse_of(defs)
    resolver = FreshnessResolver(
        instance, graph, ledger=ledger, store=warehouse.store, tables=warehouse.tables()
    )
    plan = Plan()
    needed: dict[dg.AssetKey, set[str]] = {}
    stack = [(target, p) for p in partitions]
    seen: set[tuple[dg.AssetKey, str]] = set()
    while stack:
        key, part = stack.pop()
        if (key, part) in seen:
            continue
        seen.add((key, part))
        status = resolver.status(key, part)
        if status.fresh:
            plan.fresh.append((key, part))
            continue
        if status.kind is Kind.IN_FLIGHT:  # the ledger's rule: left to the run writing it
            plan.in_flight[(key, part)] = status
            continue
        needed.setdefault(key, set()).add(part)
        plan.reasons[(key, part)] = status
        stack.extend(p for p in resolver.parents(key, part) if graph.get(p[0]).is_materializable)
    for key in graph.toposorted_asset_keys:
        if key in needed:
            plan.steps.append((key, sorted(needed[key])))
    return plan


def _checked_graph(defs: dg.Definitions, target: dg.AssetKey) -> Any:
    graph = defs.resolve_asset_graph()
    if not graph.has(target) or not graph.get(target).is_materializable:
        known = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        raise BackfillError(
            f"no asset {target.to_user_string()!r} in the code location; known: {', '.join(known)}"
        )
    return graph


def code_version_changed(instance: dg.DagsterInstance, graph: Any, key: dg.AssetKey) -> bool:
    """Unpartitioned ``key`` was materialized under another code version than it has now
    (a champion whose gates changed): Dagster shows it unsynced."""
    event = instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event is not None else None
    if mat is None:
        return False
    return (mat.tags or {}).get(CODE_VERSION_TAG) != graph.get(key).code_version


def model_partitions(defs: dg.Definitions, key: dg.AssetKey, start: str, end: str) -> list[str]:
    graph = _checked_graph(defs, key)
    pdef = graph.get(key).partitions_def
    if pdef is None:
        raise BackfillError(f"{key.to_user_string()} is not partitioned")
    for name, value in (("--start-ds", start), ("--end-ds", end)):
        if not pdef.has_partition_key(value):
            first = pdef.get_first_partition_key()
            last = pdef.get_last_partition_key()
            since = graph.get(key).metadata.get("zipline/start_partition")
            why = (
                f" (its training query's start_partition is {since}: a partition whose window "
                "reaches before it is not trainable)"
                if since
                else ""
            )
            raise BackfillError(
                f"{name}={value!r} is not a partition of {key.to_user_string()}; accepted: days "
                f"{first}..{last}{why}"
            )
    if start > end:
        raise BackfillError(f"--start-ds={start} is after --end-ds={end}")
    return list(pdef.get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))


def contiguous_runs(batches: list[list[str]], size: int) -> list[list[str]]:
    """Split each batch where days are not consecutive (a range run covers a span) and
    into runs of at most ``size`` partitions."""
    out: list[list[str]] = []
    for batch in batches:
        cur: list[str] = []
        for p in batch:
            gap = cur and dt.date.fromisoformat(p) - dt.date.fromisoformat(cur[-1]) != dt.timedelta(
                days=1
            )
            if cur and (gap or len(cur) >= size):
                out.append(cur)
                cur = []
            cur.append(p)
        if cur:
            out.append(cur)
    return out
