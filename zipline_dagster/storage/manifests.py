"""A model partition on storage, read in one place, with one definition of committed.

A promotion writes the partition's ``_MANIFEST.json`` last (``storage.artifacts``): it
lists each file of the finished model with its SHA-256. This module is the only reader of
it: the manifest as a typed ``Manifest``, and the partition as a ``ModelPartition`` whose
``state`` says what storage holds:

* ``ABSENT``: no manifest (never trained, or a first attempt still running);
* ``INCOMPLETE``: a manifest whose files are not all there (or, checked by checksum, not
  all what it lists): not a finished model;
* ``COMMITTED``: the manifest and every file it lists.

Every consumer (the planner, training's retries, scoring, the champion, maintenance,
``reproduce``, MLflow) asks ``model_partition``; checking by listing (``checksums=False``,
one listing, no reads) is what each of them does, and the gates alone verify each file's
checksum (the ``manifest_verifies`` gate).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.commits import MODEL, Commit
from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri

#: Each training attempt writes into its own folder; only a successful one is promoted
#: into ``{version}/{ds}/``, so a failed retrain leaves the finished model in place. The
#: job side (``zipline_runtime.driver.ATTEMPTS_DIR``) names the same folder; a test pins
#: the two.
ATTEMPTS_DIR = "_attempts"
SUPERSEDED_DIR = "_superseded"
#: Left in an attempt folder once it was promoted (holds the manifest it became).
PROMOTED_NAME = "_PROMOTED.json"
#: Held while one run promotes an attempt into the partition folder.
PROMOTE_LOCK_NAME = "_PROMOTING.lock"
#: Ray Train checkpoints live beside the attempts (``--checkpoint-dir``), so a new
#: attempt resumes from an earlier one's; training state, not artifacts.
CHECKPOINTS_DIR = "_checkpoints"
#: What sits in a partition folder beside its finished model's files.
NOT_ARTIFACTS = (SUPERSEDED_DIR, ATTEMPTS_DIR, CHECKPOINTS_DIR, PROMOTE_LOCK_NAME, PROMOTED_NAME)


class PartitionState(enum.Enum):
    ABSENT = "absent"
    INCOMPLETE = "incomplete"
    COMMITTED = "committed"


@dataclass(frozen=True)
class ManifestFile:
    """One file of a finished model, as its manifest lists it."""

    path: str
    sha256: str
    bytes: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A model partition's manifest: what promotion committed, typed. ``written`` keeps
    every field as written (the model's declaration, window, job, launcher ...)."""

    files: tuple[ManifestFile, ...]
    #: the attempt promoted (its submission id)
    attempt: str | None
    #: when it was committed (seconds since the epoch)
    committed_at: float | None
    #: the Dagster run that trained it
    run_id: str | None
    #: the trainer version
    version: str | None
    #: the model's code version (``ModelCodeVersion``'s form)
    code_version: str | None
    #: the trainer's flags (MLflow logs them as params)
    flags: tuple[str, ...]
    #: the Iceberg snapshot it read (``metadata``, ``snapshot_id``): ``reproduce`` reads it
    input: Mapping[str, Any]
    written: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Manifest:
        def text(key: str) -> str | None:
            value = raw.get(key)
            return str(value) if value else None

        at = raw.get("committed_at")
        files = tuple(
            ManifestFile(
                str(f["path"]),
                str(f.get("sha256") or ""),
                f.get("bytes") if isinstance(f.get("bytes"), int) else None,
            )
            for f in raw.get("files") or ()
            if isinstance(f, Mapping) and "path" in f
        )
        read = raw.get("input")
        return cls(
            files=files,
            attempt=text("attempt"),
            committed_at=float(at) if isinstance(at, (int, float)) else None,
            run_id=text("dagster_run_id"),
            version=text("version"),
            # a manifest written before declarations were versioned names the trainer only
            code_version=text("code_version") or text("version"),
            flags=tuple(str(f) for f in raw.get("flags") or ()),
            input=dict(read) if isinstance(read, Mapping) else {},
            written=dict(raw),
        )

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def snapshot_id(self) -> int | None:
        """The Iceberg snapshot of the training table it read (None: not recorded)."""
        snapshot = self.input.get("snapshot_id")
        return snapshot if isinstance(snapshot, int) else None


@dataclass(frozen=True)
class ModelPartition:
    """What storage holds for one model partition (``model_dir``, day ``ds``)."""

    model_dir: str
    ds: str
    manifest: Manifest | None
    state: PartitionState

    @property
    def committed(self) -> bool:
        return self.state is PartitionState.COMMITTED

    @property
    def attempt(self) -> str | None:
        """The attempt its manifest names (whatever the state; None: no manifest)."""
        return self.manifest.attempt if self.manifest is not None else None

    def commit(self) -> Commit | None:
        """Its commit, in the shape the ledger compares (None: not committed)."""
        if not self.committed or self.manifest is None:
            return None
        m = self.manifest
        return Commit(
            MODEL,
            self.ds,
            self.model_dir,
            m.attempt,
            run_id=m.run_id,
            at=m.committed_at,
            code_version=m.code_version,
            version=m.version,
        )

    @property
    def manifest_uri(self) -> str:
        return manifest_uri(self.model_dir)


def manifest_uri(model_dir: str) -> str:
    """Where a model partition's manifest is (written last: it commits the partition)."""
    return join_uri(model_dir, MANIFEST_NAME)


def read_manifest(store: BlobStore, model_dir: str) -> Manifest | None:
    """The partition's manifest as written (None: none, or not a JSON object), whatever
    its files hold. Invalid JSON raises ValueError."""
    try:
        raw = json.loads(store.read_bytes(manifest_uri(model_dir)))
    except FileNotFoundError:
        return None
    return Manifest.parse(raw) if isinstance(raw, dict) else None


def artifact_files(store: BlobStore, model_dir: str) -> list[str]:
    """The files directly of ``model_dir``'s finished model: not superseded ones,
    attempts or checkpoints."""
    out = []
    for uri in store.list(model_dir):
        first = uri[len(model_dir) :].lstrip("/").split("/", 1)[0]
        if first not in NOT_ARTIFACTS:
            out.append(uri)
    return out


def model_partition(
    store: BlobStore, model_dir: str, ds: str | None = None, *, checksums: bool = False
) -> ModelPartition:
    """What storage holds for the partition at ``model_dir`` (day ``ds``; None: the
    folder's name, ``{version}/{ds}``): committed when its manifest exists and every file
    it lists is there (one listing), or, with ``checksums``, also matches the SHA-256 it
    lists (a read of each)."""
    ds = ds or model_dir.rstrip("/").rsplit("/", 1)[-1]
    manifest = read_manifest(store, model_dir)
    if manifest is None:
        return ModelPartition(model_dir, ds, None, PartitionState.ABSENT)
    whole = (
        _checksums_match(store, model_dir, manifest)
        if checksums
        else _files_present(store, model_dir, manifest)
    )
    state = PartitionState.COMMITTED if whole else PartitionState.INCOMPLETE
    return ModelPartition(model_dir, ds, manifest, state)


def _files_present(store: BlobStore, model_dir: str, manifest: Manifest) -> bool:
    present = set(artifact_files(store, model_dir))
    return all(join_uri(model_dir, f.path) in present for f in manifest.files)


def _checksums_match(store: BlobStore, model_dir: str, manifest: Manifest) -> bool:
    for f in manifest.files:
        try:
            digest, _ = store.sha256(join_uri(model_dir, f.path))
        except FileNotFoundError:
            return False
        if digest != f.sha256:
            return False
    return True


def manifest_attempt(store: BlobStore, model_dir: str) -> str | None:
    """The attempt the partition's manifest names (None: no manifest, or one naming none)."""
    manifest = read_manifest(store, model_dir)
    return manifest.attempt if manifest is not None else None
