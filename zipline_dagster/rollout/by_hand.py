"""Moving a model's champion by hand: ``zipline-dagster promote`` and ``rollback``.

Both take the champion's lock, judge what they point at (a promoted partition's gates; a
rolled-back-to partition's manifest and attempt) and write the pointer as
``champion.advance`` does, the one replaced kept in the history.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from zipline_dagster.declarations.model import VERSION_ACCEPTED, VERSION_RE, Model, is_day
from zipline_dagster.rollout import gates as g
from zipline_dagster.rollout.champion import (
    RECORDED,
    ChampionError,
    default_actor,
    judge,
    make_pointer,
    why_pinned_attempt_gone,
)
from zipline_dagster.storage.artifacts import promotion_lock
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import (
    LOCK_NAME,
    ChampionPointer,
    champion_uri,
    earlier_pointer,
    model_root,
    read_champion,
    write_pointer,
)
from zipline_dagster.storage.manifests import ModelPartition, model_partition
from zipline_dagster.storage.paths import model_dir_uri


def _checked(model: Model, ds: str, version: str | None) -> str:
    """The version to promote ``ds`` of; both name storage paths, so both are checked."""
    if not is_day(ds):
        raise ChampionError(
            f"cannot promote {model.name}: ds={ds!r} is not a day; expected YYYY-MM-DD "
            "(a model partition, e.g. 2026-07-10)"
        )
    if version is not None and not VERSION_RE.match(version):
        raise ChampionError(
            f"cannot promote {model.name}: version={version!r} is not a trainer archive's "
            f"content address; expected {VERSION_ACCEPTED}, or none for the model's own "
            f"({model.version})"
        )
    return version or model.version


def promote(
    store: BlobStore,
    model: Model,
    ds: str,
    *,
    version: str | None = None,
    force: bool = False,
    by: str | None = None,
    left: list[str] | None = None,
    in_flight: Callable[[ModelPartition], str | None] | None = None,
) -> ChampionPointer:
    """Point the champion at ``ds`` (of ``version``) by hand.

    ``left``: when given, a lock that cannot be deleted once the pointer is written is
    added to it (see ``lock_left_behind``) rather than raised, the pointer having moved.
    ``in_flight``: as for ``advance``, for a partition of the model's own version (the
    one Dagster's model asset records); a reason it gives fails ``RECORDED`` like a gate.

    Raises:
        ChampionError: ``ds`` is not a day or ``version`` not a content address (both
            name storage paths), the partition is not trained (no manifest), or a gate
            failed and ``force`` is not set; the message lists each failed gate with its
            numbers.
    """
    version = _checked(model, ds, version)
    model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, version, ds)
    with promotion_lock(store, model_root(model), lock_name=LOCK_NAME, left=left):
        current = read_champion(store, model)
        partition = model_partition(store, model_dir, ds)
        results, attempt = judge(store, model, ds, version, manifest=partition.manifest)
        why_not = (
            in_flight(partition)
            if in_flight is not None and partition.manifest is not None and version == model.version
            else None
        )
        if why_not:
            results[RECORDED] = g.GateResult(RECORDED, False, why_not)
        if not results[g.MANIFEST_VERIFIES].passed:
            raise ChampionError(
                f"cannot promote {model.name} {version}/{ds}: "
                f"{results[g.MANIFEST_VERIFIES].summary} (not a finished model; even --force "
                "never points at one)"
            )
        failed = {n: r for n, r in results.items() if not r.passed}
        if failed and not force:
            raise ChampionError(
                f"refusing to promote {model.name} {version}/{ds}: "
                + "; ".join(f"{n}: {r.summary}" for n, r in failed.items())
                + ". Pass --force to promote it anyway (recorded in the pointer)."
            )
        why = (
            f"promoted by hand with --force despite: {', '.join(failed)}"
            if failed
            else "promoted by hand"
        )
        report = g.read_partition_report(store, model_dir)
        return write_pointer(
            store,
            model,
            make_pointer(
                model,
                version,
                ds,
                results,
                by=by or default_actor(),
                why=why,
                forced=bool(failed),
                report=report,
                attempt=attempt,
            ),
            current,
        )


def rollback(
    store: BlobStore,
    model: Model,
    *,
    by: str | None = None,
    left: list[str] | None = None,
    why: str | None = None,
    retire: bool = False,
    only_from: str | None = None,
) -> ChampionPointer:
    """Point the champion back at the pointer the current one replaced (``left``: as for
    ``promote``; ``why``: the pointer's reason, "rollback from ..." unless given;
    ``retire``: the partition rolled back from is never advanced to again; ``only_from``:
    the champion (``{version}/{ds}``) the caller judged, refused if another serves now).

    Raises:
        ChampionError: there is no champion, no earlier one, or the earlier partition is
            no longer a finished model on storage.
    """
    with promotion_lock(store, model_root(model), lock_name=LOCK_NAME, left=left):
        current = read_champion(store, model)
        if current is None:
            raise ChampionError(f"{model.name} has no champion ({champion_uri(model)} is absent)")
        if only_from is not None and current.where != only_from:
            raise ChampionError(
                f"{model.name}'s champion moved to {current.where} after {only_from} was "
                "judged; it is judged again at its next evaluation"
            )
        if not current.replaced:
            raise ChampionError(
                f"{model.name}'s champion {current.where} "
                "replaced nothing: there is no earlier champion to roll back to"
            )
        earlier = earlier_pointer(store, model, current.replaced)
        verdict = g.check_manifest(store, earlier.artifact_uri)
        if not verdict.passed:
            raise ChampionError(
                f"cannot roll {model.name} back to {earlier.where}: {verdict.summary}"
            )
        retrained = why_pinned_attempt_gone(store, earlier)
        if retrained:
            raise ChampionError(
                f"cannot roll {model.name} back: {retrained}. Promote it by hand "
                f"(`zipline-dagster promote {model.name} --ds {earlier.ds} --version "
                f"{earlier.version}`) to judge what it holds now"
            )
        pointer = dataclasses.replace(
            earlier,
            history_name=None,
            moved_at=None,
            moved_by=by or default_actor(),
            why=why or f"rollback from {current.where}",
            retired=(current.where,) if retire else (),
            # a challenger was judged against the champion rolled back from
            challenger=None,
        )
        return write_pointer(store, model, pointer, current, rollback=True)
