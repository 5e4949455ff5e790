"""The champion pointer: which trained partition of a model is the one in use.

The pointer (``storage.champion_pointer``, its one reader and writer) holds the version,
ds, artifact URI, metrics, the gates that passed, and when, by whom and why it moved;
written whole under a storage lock, the pointer it replaces kept in the model's history
(``replaced`` names it), so a rollback walks back one step at a time. This module decides
what it holds.

It only ever points at a partition whose manifest verifies and whose blocking gates all
passed, unless a person forces it (``forced`` and the failed gates are recorded). Moving
on its own, it also passes over a newer partition whose threshold metrics regress beyond
``RolloutStrategy.regression_tolerance`` against it: that is the champion's decision,
never a partition's gate.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zipline_dagster.declarations.model import Model
from zipline_dagster.declarations.versions import gates_version
from zipline_dagster.rollout import gates as g
from zipline_dagster.storage.artifacts import (
    STALE_LOCK_S,
    promotion_lock,
    report_metrics,
)
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import (
    LOCK_NAME,
    Challenger,
    ChampionPointer,
    model_root,
    read_champion,
    trained_partitions,
    write_pointer,
)
from zipline_dagster.storage.manifests import (
    Manifest,
    ModelPartition,
    manifest_attempt,
    model_partition,
)
from zipline_dagster.storage.paths import model_dir_uri


class ChampionError(RuntimeError):
    """The champion cannot move as asked; the message says why (with the numbers)."""


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Decision:
    """What the automatic advance chose: the pointer written (None if it stayed) and,
    for each newer partition passed over, the gates that failed it (or the comparison
    with the champion, ``gates.NO_REGRESSION``, when it regressed)."""

    pointer: ChampionPointer | None
    moved: bool
    rejected: dict[str, list[g.GateResult]]
    reason: str
    #: the champion's lock, when it could not be deleted once the decision was made
    #: (``lock_left_behind`` says what that means)
    left_behind: list[str] = field(default_factory=list)
    #: the current gates the champion that stays fails (it keeps serving: no trained
    #: partition passes them); empty when it passes them
    failing: list[g.GateResult] = field(default_factory=list)


def lock_left_behind(model: Model, left: list[str]) -> str:
    """The warning for a champion lock that could not be deleted once the pointer was
    written (or left as it was): the move stands; the next one has to break the lock."""
    return (
        f"{model.name}'s champion lock could not be deleted: {', '.join(left)}. The pointer "
        f"is as reported; the next move of {model.name}'s champion breaks the lock once its "
        f"holder has ended (seen from the same machine) or it is {STALE_LOCK_S:.0f}s old, "
        "which needs permission to delete it (or delete it by hand)"
    )


def make_pointer(
    model: Model,
    version: str,
    ds: str,
    results: dict[str, g.GateResult],
    *,
    by: str,
    why: str,
    forced: bool = False,
    report: Mapping[str, Any] | None = None,
    attempt: str | None = None,
) -> ChampionPointer:
    metrics = held_metrics(report)
    return ChampionPointer(
        model=model.name,
        version=version,
        ds=ds,
        artifact_uri=model_dir_uri(model.model_artifact_base_uri, model.name, version, ds),
        attempt=attempt,
        metrics=metrics,
        checks_passed=tuple(n for n, r in results.items() if r.passed),
        checks_failed={n: r.summary for n, r in results.items() if not r.passed},
        forced=forced,
        gates_version=gates_version(model),
        moved_by=by,
        why=why,
    )


def judge(
    store: BlobStore,
    model: Model,
    ds: str,
    version: str | None = None,
    *,
    manifest: Manifest | None = None,
) -> tuple[dict[str, g.GateResult], str | None]:
    """Every gate of partition ``ds`` and the attempt they judged (its manifest's;
    ``manifest``: the partition's, when the caller has just read it).

    Raises:
        ChampionError: the partition was trained again while it was judged.
    """
    version = version or model.version
    model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, version, ds)
    before = manifest_attempt(store, model_dir) if manifest is None else manifest.attempt
    results = g.evaluate(model, store, ds, version=version)
    after = manifest_attempt(store, model_dir)
    if after != before:
        raise ChampionError(
            f"{model.name} {version}/{ds} was trained again while its gates were read "
            f"(attempt {before}, now {after}); the champion did not move: run it again"
        )
    return results, after


def why_pinned_attempt_gone(store: BlobStore, pointer: ChampionPointer) -> str | None:
    """Why the partition a champion ``pointer`` names no longer holds the attempt that
    was judged when it moved there (it was trained again since), or None when it does."""
    judged = pointer.attempt
    held = manifest_attempt(store, pointer.artifact_uri)
    if held == judged:
        return None
    now = (
        f"attempt {held}"
        if held
        else "no finished model (no manifest: it is being trained again, or was deleted)"
    )
    return (
        f"{pointer.where} was trained again after it became "
        f"champion: it holds {now}, not the attempt {judged} that was judged"
    )


def advance(
    store: BlobStore,
    model: Model,
    *,
    by: str,
    in_flight: Callable[[ModelPartition], str | None] | None = None,
) -> Decision:
    """Move the champion to the newest trained partition of the model's version that is
    newer than it, passes every gate and does not regress against it beyond the declared
    tolerance; stay when there is none. A lock that cannot be
    deleted afterwards is in ``left_behind``, the decision standing.

    ``in_flight`` (a partition as storage holds it -> why it is left to a run still writing
    it, or None; the ledger's rule, ``rollout.assets.why_in_flight``, which records a
    partition whose run ended without recording it): a partition it names a reason for is
    passed over, the reason in ``rejected`` under ``RECORDED``."""
    left: list[str] = []
    with promotion_lock(store, model_root(model), lock_name=LOCK_NAME, left=left):
        decision = _advance(store, model, by=by, in_flight=in_flight)
    return replace(decision, left_behind=left)


#: ``Decision.rejected``'s name for a partition a run is still writing (not recorded yet)
RECORDED = "recorded_by_dagster"
#: ``Decision.rejected``'s name for a partition the rollback policy retired
RETIRED = "retired"


@dataclass(frozen=True)
class _Passing:
    """The partition a search found passing every gate, as judged."""

    ds: str
    results: dict[str, g.GateResult]
    attempt: str | None
    report: Mapping[str, Any]


def _first_passing(
    store: BlobStore,
    model: Model,
    days: list[str],
    rejected: dict[str, list[g.GateResult]],
    *,
    in_flight: Callable[[ModelPartition], str | None] | None,
    compare_with: ChampionPointer | None = None,
    retired: tuple[str, ...] = (),
) -> _Passing | None:
    """The newest of ``days`` (of the model's version) that passes every gate, is not
    left to a run writing it (``in_flight``), is not ``retired`` (rolled back from by
    policy) and, with ``compare_with`` (a champion), does not regress against it; each
    one passed over goes into ``rejected`` with why."""
    for ds in reversed(days):
        if f"{model.version}/{ds}" in retired:
            rejected[ds] = [g.GateResult(RETIRED, False, "retired: rolled back from by policy")]
            continue
        if f"{model.version}/*" in retired:
            rejected[ds] = [
                g.GateResult(
                    RETIRED,
                    False,
                    f"retired: trainer version {model.version} was worse than the champion on "
                    "its shadow days",
                )
            ]
            continue
        model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, model.version, ds)
        partition = model_partition(store, model_dir, ds)
        why_not = in_flight(partition) if in_flight is not None else None
        if why_not:
            rejected[ds] = [g.GateResult(RECORDED, False, why_not)]
            continue
        results, attempt = judge(store, model, ds, manifest=partition.manifest)
        failed = [r for r in results.values() if not r.passed]
        if failed:
            rejected[ds] = failed
            continue
        report = g.read_partition_report(store, model_dir) or {}
        # the champion's own decision: a newer partition may not be worse than it
        regression = g.check_no_regression(model, report, compare_with)
        if not regression.passed and regression.compared:
            rejected[ds] = [regression]
            continue
        return _Passing(ds, results, attempt, report)
    return None


def _advance(
    store: BlobStore,
    model: Model,
    *,
    by: str,
    in_flight: Callable[[ModelPartition], str | None] | None,
) -> Decision:
    """``advance`` under the lock."""
    current = read_champion(store, model)
    failing = fails_current_gates(model, current)
    if current is not None and failing:
        return _replace_failing(store, model, current, failing, by=by, in_flight=in_flight)
    # the champion's own partition trained again is judged again: it holds another attempt
    retrained = why_pinned_attempt_gone(store, current) if current is not None else None
    newer = _newer(trained_partitions(store, model), model, current, retrained)
    rejected: dict[str, list[g.GateResult]] = {}
    found = _first_passing(
        store, model, newer, rejected, in_flight=in_flight, compare_with=current,
        retired=getattr(current, "retired", ()),
    )  # fmt: skip
    if found is None:
        return Decision(
            current, False, rejected, _stays(model, current, newer, rejected, retrained)
        )
    if model.rollout.shadow and current is not None and current.version != model.version:
        return _challenge(store, model, current, found, rejected)
    why = "newest partition passing every gate" + (
        f" (after {len(rejected)} newer rejected)" if rejected else ""
    )
    if current is not None and found.ds == current.ds and retrained:
        why += f" (its partition was trained again: attempt {found.attempt} judged)"
    pointer = make_pointer(
        model, model.version, found.ds, found.results, by=by, why=why,
        report=found.report, attempt=found.attempt,
    )  # fmt: skip
    return Decision(write_pointer(store, model, pointer, current), True, rejected, why)


def _newer(
    days: list[str], model: Model, current: ChampionPointer | None, retrained: str | None
) -> list[str]:
    """The trained ``days`` of the model's version that may replace ``current``: newer,
    or the same day of another version or trained again (``retrained``)."""
    if current is None:
        return days
    again = model.version != current.version or bool(retrained)
    return [ds for ds in days if ds > current.ds or (ds == current.ds and again)]


def _challenge(
    store: BlobStore,
    model: Model,
    current: ChampionPointer,
    found: _Passing,
    rejected: dict[str, list[g.GateResult]],
) -> Decision:
    """The shadow rollout: ``found``, a passing partition of a new trainer version, becomes
    the challenger (or stays it) instead of the champion (``rollout.shadow`` judges it
    on its live days)."""
    held = current.shadowed_by
    n = model.rollout.days
    if held is not None and (held.version, held.ds, held.attempt) == (
        model.version,
        found.ds,
        found.attempt,
    ):
        why = (
            f"stays at {current.where}; the challenger {held.where} shadows it until {n} "
            "monitored days judge it"
        )
        return Decision(current, False, rejected, why)
    since = held.since if held is not None and held.version == model.version else ""
    challenger = Challenger(
        version=model.version,
        ds=found.ds,
        artifact_uri=model_dir_uri(
            model.model_artifact_base_uri, model.name, model.version, found.ds
        ),
        attempt=found.attempt,
        metrics=held_metrics(found.report),
        since=since or now_iso(),
    )
    why = (
        f"stays at {current.where}; {challenger.where} (trainer version {model.version}, new) "
        f"passes every gate and becomes the challenger: it scores each day beside the "
        f"champion and serves once {n} monitored days show it not worse"
    )
    pointer = write_pointer(
        store, model, replace(current, challenger=challenger), current, amend=True
    )
    return Decision(pointer, False, rejected, why)


def now_iso() -> str:
    """Now (UTC) to the second, as the champion's records write it."""
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def held_metrics(report: Mapping[str, Any] | None) -> dict[str, float]:
    """A partition report's metrics as a pointer holds them (``{split}_{metric}``, those
    it has)."""
    return {k: v for k, v in report_metrics(report or {}).items() if v is not None}


def _stays(
    model: Model,
    current: ChampionPointer | None,
    newer: list[str],
    rejected: dict[str, list[g.GateResult]],
    retrained: str | None,
) -> str:
    """Why the champion did not move (``retrained``: why its own partition no longer
    holds what was judged)."""
    if current is None:
        return "no trained partition passes every gate yet" if newer else "nothing trained"
    reason = f"stays at {current.where}: " + (
        "no newer partition passes every gate" if newer else "no newer trained partition"
    )
    regressed = sorted(ds for ds, r in rejected.items() if r[0].gate == g.NO_REGRESSION)
    if regressed:
        reason += (
            f" ({', '.join(regressed)} passed but regressed beyond the tolerance "
            f"{model.rollout.regression_tolerance:g})"
        )
    if retrained:
        reason += (
            f"; but {retrained}, and what it holds now did not "
            "pass: scoring by the champion refuses it until a partition passes or one is "
            "promoted by hand"
        )
    return reason


def fails_current_gates(model: Model, pointer: ChampionPointer | None) -> list[g.GateResult]:
    """The model's current thresholds that the champion ``pointer`` fails, judged on the
    metrics it recorded when it moved (empty when it passes, or when a person forced it
    under the gates in force now)."""
    if pointer is None:
        return []
    if pointer.forced and pointer.gates_version == gates_version(model):
        return []
    values: dict[str, float | None] = dict(pointer.metrics)
    result = g.check_thresholds(model, {}, values)
    return [] if result.passed else [result]


def _replace_failing(
    store: BlobStore,
    model: Model,
    current: ChampionPointer,
    failing: list[g.GateResult],
    *,
    by: str,
    in_flight: Callable[[ModelPartition], str | None] | None,
) -> Decision:
    """The champion fails the current gates: move to the newest trained partition of the
    model's version that passes them (no comparison with a champion that fails them), or
    keep serving it, saying which gates it fails."""
    where = current.where
    fails = "; ".join(r.summary for r in failing)
    rejected: dict[str, list[g.GateResult]] = {}
    found = _first_passing(
        store, model, trained_partitions(store, model), rejected, in_flight=in_flight,
        retired=current.retired,
    )  # fmt: skip
    if found is None:
        reason = (
            f"stays at {where}, which fails the current gates ({fails}): no trained partition "
            "passes them; it keeps serving until one does or one is promoted by hand"
        )
        return Decision(current, False, rejected, reason, failing=failing)
    why = f"the champion {where} fails the current gates ({fails}); newest partition passing them"
    pointer = make_pointer(
        model, model.version, found.ds, found.results, by=by, why=why,
        report=found.report, attempt=found.attempt,
    )  # fmt: skip
    return Decision(write_pointer(store, model, pointer, current), True, rejected, why)
