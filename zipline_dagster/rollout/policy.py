"""Rollback by policy: the champion moves back to the champion it replaced once its live
metrics have been worse than its holdout for ``RolloutStrategy.rollback_after_days``
monitored days running.

The live metrics are the monitoring asset's (``scoring.monitoring``): each scored day's
realized metrics and the model partition that scored it (``model_version`` and
``model_ds`` in its metadata). A day counts for the champion when the champion's own
partition scored it; the K latest such days are compared, each on the model's threshold
metrics (``holdout_auc`` is compared with the day's realized ``auc``), against the
champion's holdout value recorded in its pointer, with ``regression_tolerance`` as the
slack. The partition rolled back from is retired: the automatic advance never moves to it
again (``ChampionPointer.retired``); a person may promote it by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.lineage.partitions import SCORED_BY
from zipline_dagster.rollout import by_hand
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import ChampionPointer

#: Most monitoring materializations read per key when looking for the champion's days.
RECENT = 400


@dataclass(frozen=True)
class LiveDay:
    """A monitored day: its realized metrics (``auc`` ...) and who scored it."""

    ds: str
    version: str
    model_ds: str
    realized: Mapping[str, float]


@dataclass(frozen=True)
class Verdict:
    """What the policy found: a rollback's reason (None: the champion stays) and a
    summary for the champion asset's check either way."""

    rollback: str | None
    summary: str


def realized(md: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The realized metrics in a monitored day's metadata ``md`` under ``prefix``."""
    return {
        k.removeprefix(prefix): float(v)
        for k, v in md.items()
        if k.startswith(prefix) and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def monitored(
    instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each monitored day (ds) and the metadata values of its latest materialization, of
    each of the monitoring ``keys`` (the ``RECENT`` newest of each)."""
    for key in keys:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key), limit=RECENT
        ).records
        seen: set[str] = set()
        for record in records:  # newest first: the first of a day is its latest
            mat, ds = record.asset_materialization, str(record.partition_key)
            if mat is None or ds in seen:
                continue
            seen.add(ds)
            yield ds, {k: v.value for k, v in mat.metadata.items()}


def live_days(
    instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey], champion: ChampionPointer
) -> list[LiveDay]:
    """The monitored days the ``champion``'s partition scored (each day's latest
    materialization of the monitoring ``keys``), oldest first."""
    days: dict[str, LiveDay] = {}
    for ds, md in monitored(instance, keys):
        day = LiveDay(
            ds, str(md.get("model_version")), str(md.get(SCORED_BY)), realized(md, "realized/")
        )
        if (day.version, day.model_ds) == (champion.version, champion.ds):
            days.setdefault(ds, day)
    return [days[ds] for ds in sorted(days)]


def judge(model: Model, champion: ChampionPointer | None, days: Sequence[LiveDay]) -> Verdict:
    """Whether ``champion`` is rolled back, on its monitored ``days`` (oldest first)."""
    rollout = model.rollout
    k, tol = rollout.rollback_after_days, rollout.regression_tolerance
    if not k or champion is None:
        return Verdict(None, "no rollback policy" if not k else "no champion")
    worse = []
    for day in days[-k:]:
        why = _worse(model, champion, day)
        if why is None:
            break
        worse.append(why)
    if len(worse) < k:
        return Verdict(
            None,
            f"{champion.where}: {len(days)} monitored day(s) scored by it; its realized "
            f"metrics are within {tol:g} of its holdout on the latest of them (a rollback "
            f"after {k} days running worse)",
        )
    why = (
        f"rollback by policy: {champion.where}'s realized metrics were worse than its holdout "
        f"by more than {tol:g} on its {k} latest monitored days running ({'; '.join(worse)})"
    )
    return Verdict(why, why)


def _worse(model: Model, champion: ChampionPointer, day: LiveDay) -> str | None:
    """How ``day`` is worse than the champion's holdout beyond the tolerance (None: not)."""
    tol = model.rollout.regression_tolerance
    for metric in model.rollout.rollout_metric_thresholds:
        held, live = champion.metrics.get(metric.name), day.realized.get(metric.key)
        if held is None or live is None:
            continue
        gap = held - live if metric.is_minimum else live - held
        if gap > tol:
            return f"{day.ds}: realized {metric.key} {live:.4f}, holdout {held:.4f}"
    return None


def apply(
    store: BlobStore,
    model: Model,
    champion: ChampionPointer | None,
    live: Callable[[ChampionPointer], list[LiveDay]],
    *,
    by: str,
) -> tuple[Verdict, ChampionPointer | None]:
    """Judge the champion on its live days and, when the policy says so, roll it back
    (the pointer written; its partition retired). The verdict, and the new pointer (None:
    no rollback).

    Raises:
        ChampionError: the policy says roll back, but there is no earlier champion, it
            can no longer serve, or the champion moved meanwhile (``by_hand.rollback``
            names why).
    """
    verdict = judge(model, champion, live(champion) if champion is not None else [])
    if verdict.rollback is None or champion is None:
        return verdict, None
    # under the champion's lock, and only if the champion judged still serves
    restored = by_hand.rollback(
        store, model, by=by, why=verdict.rollback, retire=True, only_from=champion.where
    )
    return verdict, restored
