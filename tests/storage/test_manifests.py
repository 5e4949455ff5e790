"""The one reader of a model partition on storage: its state, with one definition of
committed, and its manifest typed (storage.manifests)."""

import json

from zipline_dagster.storage.artifacts import attempt_dir, promote_attempt
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.commits import MODEL
from zipline_dagster.storage.manifests import Manifest, PartitionState, model_partition

DS = "2026-07-10"


def test_a_partition_is_absent_incomplete_or_committed_and_only_committed_has_a_commit(
    file_base: str,
) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/{DS}"
    store = blob_store(d)
    absent = model_partition(store, d)
    assert absent.state is PartitionState.ABSENT and absent.ds == DS
    assert absent.manifest is None and absent.commit() is None

    store.write_bytes(f"{attempt_dir(d, 'a1')}/metrics.json", b"{}")
    store.write_bytes(f"{attempt_dir(d, 'a1')}/model.bin", b"1")
    extra = {"version": "a" * 12, "code_version": "a" * 12 + "-d1", "dagster_run_id": "r1",
             "flags": ["--eval-days=1"], "input": {"metadata": "m.json", "snapshot_id": 7}}  # fmt: skip
    promote_attempt(store, d, "a1", extra=extra)
    held = model_partition(store, d)
    assert held.state is PartitionState.COMMITTED and held.attempt == "a1"
    assert held.manifest is not None and held.manifest.snapshot_id == 7
    assert held.manifest.flags == ("--eval-days=1",)
    commit = held.commit()
    assert commit is not None
    assert (commit.kind, commit.partition, commit.run_id) == (MODEL, DS, "r1")
    assert commit.code_version == "a" * 12 + "-d1"

    # a file it lists is gone: no longer a finished model, whoever asks
    store.delete(f"{d}/model.bin")
    gone = model_partition(store, d)
    assert gone.state is PartitionState.INCOMPLETE and gone.commit() is None
    assert gone.attempt == "a1"  # the manifest still names what it was

    # a file changed in place: only the checksum reading sees it
    store.write_bytes(f"{d}/model.bin", b"2")
    assert model_partition(store, d).committed
    assert model_partition(store, d, checksums=True).state is PartitionState.INCOMPLETE


def test_a_manifest_written_before_declarations_were_versioned_names_its_trainer() -> None:
    raw = {"files": [{"path": "model.json", "sha256": "x", "bytes": 2}], "version": "b" * 12,
           "attempt": "a1", "committed_at": 1.5}  # fmt: skip
    manifest = Manifest.parse(json.loads(json.dumps(raw)))
    assert manifest.code_version == "b" * 12 and manifest.committed_at == 1.5
    assert manifest.paths == ["model.json"] and manifest.snapshot_id is None
    assert manifest.written == raw
