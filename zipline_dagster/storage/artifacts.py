"""The artifact protocol of a model partition on storage: attempts, promotion, the
promotion lock and the manifest that commits a partition.

A partition folder ``{base}/models/{model}/{version}/{ds}/`` holds its finished model and,
beside it, each attempt's own folder (``_attempts/{id}``), earlier models moved aside
(``_superseded/``) and Ray Train checkpoints (``_checkpoints/``). A successful attempt is
promoted under the partition's lock; its ``_MANIFEST.json`` (each file's SHA-256) is
written last, as the commit marker. Training writes these; rollout, scoring and lineage
read them, all through this module.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zipline_runtime.contract import (
    REPORT_NAME,
    ContractError,
    Report,
    parse_report,
    report_metrics,
)

from zipline_dagster.processes import holder_gone, lock_owner
from zipline_dagster.storage.blobs import BlobStorageError, BlobStore
from zipline_dagster.storage.manifests import (
    ATTEMPTS_DIR,
    PROMOTE_LOCK_NAME,
    PROMOTED_NAME,
    SUPERSEDED_DIR,
    Manifest,
    artifact_files,
    model_partition,
    read_manifest,
)
from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri


def attempt_dir(model_dir: str, attempt_id: str) -> str:
    """``{model_dir}/_attempts/{attempt_id}``: where one attempt's trainer writes."""
    return join_uri(model_dir, ATTEMPTS_DIR, attempt_id)


class ArtifactError(RuntimeError):
    """The trainer finished but its artifacts are not what the contract requires."""


# ---------------------------------------------------------------------------------------
# Artifacts: superseding earlier attempts, the manifest commit marker, the report.


def supersede_previous(store: BlobStore, model_dir: str) -> str | None:
    """Move the partition's finished files aside, inside its own folder.

    The manifest goes first, so a crash mid-way never leaves the partition looking
    finished; the rest lands in ``{model_dir}/_superseded/{UTC stamp}/`` and stays
    recoverable. Returns that folder, or None when the partition was empty.
    """
    current = artifact_files(store, model_dir)
    if not current:
        return None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    dest = join_uri(model_dir, SUPERSEDED_DIR, stamp)
    manifest = join_uri(model_dir, MANIFEST_NAME)
    ordered = sorted(current, key=lambda u: u != manifest)  # manifest first
    for uri in ordered:
        rel = uri[len(model_dir) :].lstrip("/")
        store.move(uri, join_uri(dest, rel))  # a rename locally, a server copy elsewhere
    return dest


class PromotionLockError(ArtifactError):
    """Another run held the partition's promotion lock for too long."""


#: A promotion lock older than this belongs to a run that died holding it, and is broken.
STALE_LOCK_S = 600.0


@contextlib.contextmanager
def promotion_lock(
    store: BlobStore,
    model_dir: str,
    *,
    wait_s: float = 900.0,
    stale_s: float = STALE_LOCK_S,
    lock_name: str = PROMOTE_LOCK_NAME,
    left: list[str] | None = None,
) -> Iterator[None]:
    """Hold ``{model_dir}/_PROMOTING.lock`` while the partition folder changes.

    Two runs of one partition (both attached to the same Ray job, or a retrain racing a
    late one) promote one at a time, so neither moves the other's files. A lock older
    than ``stale_s`` belongs to a run that died mid-promotion and is broken; so is, at
    once, one whose holder this process can see has ended (same host and PID namespace:
    a step killed with ``kill -9``, retried on the same machine).

    ``left``: when given, a lock that cannot be deleted at the end is added to it rather
    than failing what the block did (the next promotion breaks it once stale).
    """
    uri = join_uri(model_dir, lock_name)
    owner = json.dumps(lock_owner())
    deadline = time.monotonic() + wait_s
    while not store.create_exclusive(uri, owner.encode()):
        try:
            held = json.loads(store.read_bytes(uri))
            age = time.time() - float(held.get("at", 0))
            gone = holder_gone(held)
        except Exception:  # vanished or half-visible: look again
            age, gone = 0.0, False
        if age > stale_s or gone:
            store.delete(uri)
            continue
        if time.monotonic() > deadline:
            raise PromotionLockError(
                f"{uri} has been held by another run for {age:.0f}s; the partition is left "
                "as it is. If no run is promoting it, delete the lock and retry."
            )
        time.sleep(0.2)
    try:
        yield
    finally:
        try:
            store.delete(uri)
        except (BlobStorageError, OSError):
            if left is None:
                raise
            left.append(uri)


@dataclass(frozen=True)
class Promotion:
    manifest: Manifest
    #: where the earlier finished model was moved, if there was one
    superseded: str | None
    #: True when another run had already promoted this very attempt
    already: bool
    #: the promoted attempt's report (None when ``already``: read it from the partition)
    report: Report | None = None
    #: what could not be deleted once the manifest was written (the attempt's copied
    #: files, the lock): tidying, never read, and never a failed promotion
    left_behind: list[str] = field(default_factory=list)


def promote_attempt(
    store: BlobStore, model_dir: str, attempt_id: str, *, extra: dict[str, Any]
) -> Promotion:
    """Make a successful attempt the partition's finished model.

    Under the partition's lock: check the attempt's report, move the earlier finished
    model to ``_superseded/`` (manifest first), copy the attempt's files into place and
    write ``_MANIFEST.json`` (each file's SHA-256) last, as the commit marker. Promoting
    an attempt another run already promoted returns that manifest untouched.

    Raises:
        ArtifactError: the attempt wrote no valid report (the partition is untouched),
            or it was promoted earlier and has since been superseded by another attempt.
    """
    adir = attempt_dir(model_dir, attempt_id)
    manifest_uri = join_uri(model_dir, MANIFEST_NAME)
    left: list[str] = []
    with promotion_lock(store, model_dir, left=left):
        current = read_manifest(store, model_dir)
        promoted = current is not None and current.attempt == attempt_id
        if promoted and model_partition(store, model_dir, checksums=True).committed:
            assert current is not None
            return Promotion(manifest=current, superseded=None, already=True, left_behind=left)
        if store.exists(join_uri(adir, PROMOTED_NAME)):
            raise ArtifactError(
                f"attempt {attempt_id} was promoted into {model_dir} by another run and has "
                f"since been superseded (the partition now holds attempt "
                f"{current.attempt if current is not None else 'none'}); nothing was changed"
            )
        files = [u for u in artifact_files(store, adir) if not u.endswith("/" + MANIFEST_NAME)]
        if join_uri(adir, REPORT_NAME) not in files:
            raise ArtifactError(
                f"the trainer finished but wrote no {REPORT_NAME} into {adir} "
                f"(found: {[u[len(adir) + 1 :] for u in files] or 'nothing'}); the partition "
                f"{model_dir} is left as it was"
            )
        report = read_report(store, adir)
        superseded = supersede_previous(store, model_dir)
        entries = []
        for uri in files:
            rel = uri[len(adir) :].lstrip("/")
            # streamed (a model of gigabytes never sits in this process's memory), and the
            # digest is of what landed in place
            digest, size = store.copy(uri, join_uri(model_dir, rel))
            entries.append({"path": rel, "sha256": digest, "bytes": size})
        manifest = {
            "files": entries,
            "attempt": attempt_id,
            "committed_at": time.time(),
            **extra,
        }
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        store.write_bytes(manifest_uri, body)
        # The attempt folder keeps only a note of what it became. The note is what stops
        # a late run promoting this attempt over a newer one: its write may fail the step
        # (a retry finds the manifest and records it); deleting the copies never does.
        store.write_bytes(join_uri(adir, PROMOTED_NAME), body)
        for uri in files:
            try:
                store.delete(uri)
            except (BlobStorageError, OSError):
                left.append(uri)
        promotion = Promotion(
            manifest=Manifest.parse(manifest),
            superseded=superseded,
            already=False,
            report=report,
            left_behind=left,
        )
    return promotion


def read_report(store: BlobStore, model_dir: str) -> Report:
    """The partition's report (``zipline_runtime.contract.parse_report``).

    Raises:
        ArtifactError: not JSON, or not an object (names its URI).
        BlobNotFoundError: there is none.
    """
    uri = join_uri(model_dir, REPORT_NAME)
    try:
        return parse_report(store.read_bytes(uri), where=uri)
    except ContractError as exc:
        raise ArtifactError(str(exc)) from None


__all__ = ["REPORT_NAME", "report_metrics"]
