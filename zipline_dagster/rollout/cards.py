"""The champion's decisions, appended to the cards of the partitions they were about.

A model partition's card (``training.card``) is written when it trains; the champion
asset decides about it later. Each decision about a partition (it became the champion,
it was passed over and why, it was retired by the rollback policy, it became the
challenger or was retired as one) is appended to its
``card.md`` beside its artifacts, once: an evaluation that decides the same again adds
nothing. The card on the partition's materialization stays as it was recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from zipline_runtime.contract import PartitionRef

from zipline_dagster.declarations.model import Model
from zipline_dagster.rollout import champion as ch
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStorageError, BlobStore
from zipline_dagster.storage.champion_pointer import SHADOWING
from zipline_dagster.storage.paths import CARD_NAME, join_uri

HEADING = "**Champion decisions**"


def decisions(model: Model, decision: ch.Decision) -> dict[PartitionRef, str]:
    """Each partition ``decision`` is about -> what it says about it."""
    notes: dict[PartitionRef, str] = {
        PartitionRef.of(model.name, model.version, ds): "passed over: "
        + "; ".join(f"{r.gate}: {r.summary}" for r in failed)
        for ds, failed in decision.rejected.items()
        if not any(r.gate == ch.RETIRED for r in failed)  # said once, when retired
    }
    pointer = decision.pointer
    if decision.moved and pointer is not None:
        notes[pointer.ref] = f"became the champion: {decision.reason}"
        if pointer.retired and pointer.why.startswith("rollback by policy"):
            # the pointer stores what it retired in the display form
            notes[PartitionRef.parse(model.name, pointer.retired[-1])] = f"retired ({pointer.why})"
    challenger = pointer.challenger if pointer is not None else None
    if pointer is not None and challenger is not None:  # the shadow rollout's
        notes[challenger.ref(model.name)] = (
            f"became the challenger of the champion {pointer.where} (shadow)"
            if challenger.status == SHADOWING
            else f"retired ({challenger.verdict})"
        )
    return notes


def note_decisions(
    store: BlobStore,
    model: Model,
    decision: ch.Decision,
    *,
    when: str,
    warn: Callable[[str], None],
) -> None:
    """Append ``decision`` to the cards it is about (``when``: the run and time); a card
    missing (a partition trained before cards) is left so, one that cannot be written is
    a warning."""
    for ref, text in decisions(model, decision).items():
        uri = join_uri(ref.uri(model.model_artifact_base_uri), CARD_NAME)
        try:
            card = store.read_bytes(uri).decode()
            if text in card:
                continue
            if HEADING not in card:
                card += f"\n{HEADING}\n\n"
            store.write_bytes(uri, f"{card}- {when}: {text}\n".encode())
        except BlobNotFoundError:
            continue
        except (BlobStorageError, UnicodeDecodeError) as exc:
            warn(
                f"{model.name} {ref.where}: the champion's decision was not added to its "
                f"card ({exc})"
            )
