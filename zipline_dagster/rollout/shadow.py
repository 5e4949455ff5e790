"""The shadow rollout (``RolloutStrategy(kind="shadow", days=N)``): a challenger judged on
live days before it serves.

A passing partition of a new trainer version becomes the challenger instead of the
champion (``champion._challenge``); each scored day is then scored by both
(``scoring.shadow``) and monitored for both (``challenger/realized/*`` beside the
champion's ``realized/*`` in the monitoring asset's metadata). Once N monitored days hold
both, the champion's evaluation judges the challenger on the first N of them, on each
threshold metric of the model (``holdout_auc`` compares the day's realized ``auc``):

* not worse than the champion's realized value beyond ``regression_tolerance`` on every
  one of them: the champion moves to the challenger, the comparison day by day its
  pointer's ``why`` (and so the history's);
* worse on any: the challenger is retired, its trainer version never advanced to again
  (``ChampionPointer.retired`` holds ``{version}/*``; a person may promote one by hand),
  the days it was worse named in the pointer's challenger record and the champion
  asset's check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.lineage.partitions import SCORED_BY
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import gates as g
from zipline_dagster.rollout.policy import monitored, realized
from zipline_dagster.storage.artifacts import promotion_lock
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import (
    LOCK_NAME,
    RETIRED,
    Challenger,
    ChampionPointer,
    model_root,
    read_champion,
    write_pointer,
)


@dataclass(frozen=True)
class PairedDay:
    """A monitored day scored by both: who served it and each one's realized metrics."""

    ds: str
    served_by: str
    realized: Mapping[str, float]
    challenger_realized: Mapping[str, float]


@dataclass(frozen=True)
class Verdict:
    """The shadow rollout's finding on a challenger: ``"promote"``, ``"retire"`` or
    None (wait, or no challenger), and a summary naming the days."""

    action: str | None
    summary: str


def paired_days(
    instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey], challenger: Challenger
) -> list[PairedDay]:
    """The monitored days (each day's latest materialization of the monitoring ``keys``)
    that the ``challenger``'s trainer version shadow-scored, oldest first."""
    days: dict[str, PairedDay] = {}
    for ds, md in monitored(instance, keys):
        theirs = realized(md, "challenger/realized/")
        if md.get("challenger/model_version") == challenger.version and theirs:
            served = f"{md.get('model_version')}/{md.get(SCORED_BY)}"
            days.setdefault(ds, PairedDay(ds, served, realized(md, "realized/"), theirs))
    return [days[ds] for ds in sorted(days)]


def judge(model: Model, challenger: Challenger | None, days: Sequence[PairedDay]) -> Verdict:
    """The verdict on ``challenger`` from its paired ``days`` (oldest first)."""
    n, tol = model.rollout.days or 0, model.rollout.regression_tolerance
    if challenger is None or not model.rollout.shadow:
        return Verdict(None, "no challenger shadows the champion")
    # a day counts once a threshold metric was computed for both: nothing compared is
    # no evidence either way
    days = [d for d in days if _comparable(model, d)]
    if len(days) < n:
        return Verdict(
            None,
            f"the challenger {challenger.where} shadows the champion: {len(days)} of {n} "
            "monitored days scored by both",
        )
    compared, worse = [], []
    for day in days[:n]:
        line, is_worse = _compare(model, day)
        compared.append(line)
        if is_worse:
            worse.append(day.ds)
    if worse:
        return Verdict(
            "retire",
            f"challenger {challenger.where} retired: worse than the champion beyond the "
            f"tolerance {tol:g} on {', '.join(worse)} of its {n} shadow days "
            f"({'; '.join(compared)})",
        )
    return Verdict(
        "promote",
        f"challenger {challenger.where} promoted after {n} shadow days not worse than the "
        f"champion beyond the tolerance {tol:g} ({'; '.join(compared)})",
    )


def _comparable(model: Model, day: PairedDay) -> bool:
    """Whether ``day`` holds a threshold metric realized by both."""
    return any(
        day.challenger_realized.get(m.key) is not None and day.realized.get(m.key) is not None
        for m in model.rollout.rollout_metric_thresholds
    )


def _compare(model: Model, day: PairedDay) -> tuple[str, bool]:
    """Day ``day``'s comparison on each threshold metric both have, and whether the
    challenger is worse on one beyond the tolerance."""
    tol, parts, worse = model.rollout.regression_tolerance, [], False
    for metric in model.rollout.rollout_metric_thresholds:
        theirs, ours = day.challenger_realized.get(metric.key), day.realized.get(metric.key)
        if theirs is None or ours is None:
            parts.append(f"{metric.key} not computed for both")
            continue
        gap = ours - theirs if metric.is_minimum else theirs - ours
        worse = worse or gap > tol
        parts.append(f"{metric.key} {theirs:.4f} vs {ours:.4f} ({day.served_by})")
    return f"{day.ds}: " + ", ".join(parts), worse


def apply(
    store: BlobStore,
    model: Model,
    live: Callable[[Challenger], list[PairedDay]],
    *,
    by: str,
) -> tuple[Verdict, ch.Decision | None]:
    """Judge the challenger that shadows the champion and, when the verdict says so,
    promote it or retire it (under the champion's lock, only if the same challenger
    still shadows the same champion). The verdict, and the decision when it acted."""
    current = read_champion(store, model)
    challenger = current.shadowed_by if current is not None else None
    verdict = judge(model, challenger, live(challenger) if challenger is not None else [])
    if verdict.action is None or current is None or challenger is None:
        return verdict, None
    left: list[str] = []
    with promotion_lock(store, model_root(model), lock_name=LOCK_NAME, left=left):
        now = read_champion(store, model)
        if now is None or (now.where, now.shadowed_by) != (current.where, challenger):
            return Verdict(None, f"{verdict.summary}; but the champion changed meanwhile"), None
        decision = (
            _promote(store, model, now, challenger, verdict, by)
            if verdict.action == "promote"
            else _retire(store, model, now, challenger, verdict)
        )
    return verdict, dataclasses.replace(decision, left_behind=left)


def _promote(
    store: BlobStore,
    model: Model,
    current: ChampionPointer,
    challenger: Challenger,
    verdict: Verdict,
    by: str,
) -> ch.Decision:
    """The champion moves to the challenger, judged again (what it holds now)."""
    results, attempt = ch.judge(store, model, challenger.ds, challenger.version)
    failed = [r for r in results.values() if not r.passed]
    if failed or attempt != challenger.attempt:
        why = "; ".join(r.summary for r in failed) or f"it holds attempt {attempt} now"
        reason = f"{verdict.summary}; but it cannot serve: {why}"
        return ch.Decision(current, False, {}, reason)
    report = g.read_partition_report(store, challenger.artifact_uri)
    pointer = ch.make_pointer(
        model, challenger.version, challenger.ds, results, by=by, why=verdict.summary,
        report=report, attempt=attempt,
    )  # fmt: skip
    return ch.Decision(write_pointer(store, model, pointer, current), True, {}, verdict.summary)


def _retire(
    store: BlobStore,
    model: Model,
    current: ChampionPointer,
    challenger: Challenger,
    verdict: Verdict,
) -> ch.Decision:
    """The challenger is retired with its version; the champion stays."""
    ended = dataclasses.replace(challenger, status=RETIRED, verdict=verdict.summary)
    pointer = dataclasses.replace(
        current, challenger=ended, retired=(*current.retired, f"{challenger.version}/*")
    )
    written = write_pointer(store, model, pointer, current, amend=True)
    return ch.Decision(written, False, {}, verdict.summary)
