"""Training requests, flags, windows and the artifact commit protocol (no Ray needed)."""

from __future__ import annotations

import json

import pytest

from tests.test_models import make_model
from zipline_dagster.paths import MANIFEST_NAME
from zipline_dagster.storage import blob_store
from zipline_dagster.training import (
    ArtifactError,
    build_training_request,
    is_committed,
    supersede_previous,
    window_days,
    write_manifest,
)


def test_window_is_exactly_n_days_ending_at_ds() -> None:
    assert window_days("2026-07-10", 4) == ["2026-07-07", "2026-07-08", "2026-07-09", "2026-07-10"]
    assert window_days("2026-03-01", 2) == ["2026-02-28", "2026-03-01"]
    assert window_days("2026-07-10", 1) == ["2026-07-10"]


def test_flags_platform_first_then_job_configs() -> None:
    model = make_model(
        "a" * 12, "s3://b/wh", job_configs={"label-column": "label", "eval-days": "1"}
    )
    req = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    assert req.flags == (
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-07",
        "--end-ds=2026-07-10",
        f"--model-dir=s3://b/wh/models/listing_ctr_model/{'a' * 12}/2026-07-10",
        "--warehouse=s3://b/tables",
        "--label-column=label",
        "--eval-days=1",
    )
    assert req.entrypoint.startswith("python -m trainer.train --input-table=ctr.training_v1 ")
    assert req.job_key == f"listing_ctr_model-{'a' * 12}-2026-07-10"


def test_derived_flags_overridable_once() -> None:
    model = make_model(
        "a" * 12, "s3://b/wh", job_configs={"model-dir": "s3://x/m", "warehouse": "s3://x/t"}
    )
    req = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    assert req.model_dir == "s3://x/m" and req.warehouse == "s3://x/t"
    assert [f for f in req.flags if f.startswith("--model-dir")] == ["--model-dir=s3://x/m"]
    assert [f for f in req.flags if f.startswith("--warehouse")] == ["--warehouse=s3://x/t"]


def test_values_with_spaces_are_quoted_in_the_entrypoint() -> None:
    model = make_model("a" * 12, "file:///wh", job_configs={"note": "two words; rm -rf /"})
    req = build_training_request(model, "2026-07-10", warehouse="file:///wh")
    assert "'--note=two words; rm -rf /'" in req.entrypoint


def test_bad_partition_key_refused() -> None:
    with pytest.raises(ValueError):
        build_training_request(
            make_model("a" * 12, "file:///wh"), "July 10", warehouse="file:///wh"
        )


def test_manifest_is_the_commit_marker(file_base: str) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    store.write_bytes(f"{d}/model.json", b"{}")
    with pytest.raises(ArtifactError, match="wrote no metrics.json"):
        write_manifest(store, d, extra={})
    assert not is_committed(store, d)
    store.write_bytes(f"{d}/metrics.json", b'{"train": {}}')
    manifest = write_manifest(store, d, extra={"model": "m"})
    assert [f["path"] for f in manifest["files"]] == ["metrics.json", "model.json"]
    assert is_committed(store, d)
    store.write_bytes(f"{d}/model.json", b"changed after commit")
    assert not is_committed(store, d)


def test_supersede_moves_everything_and_manifest_first(file_base: str) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    assert supersede_previous(store, d) is None
    store.write_bytes(f"{d}/metrics.json", b"{}")
    store.write_bytes(f"{d}/sub/model.bin", b"1")
    write_manifest(store, d, extra={})
    dest = supersede_previous(store, d)
    assert dest is not None and dest.startswith(f"{d}/_superseded/")
    assert not is_committed(store, d)
    assert sorted(u[len(dest) + 1 :] for u in store.list(dest)) == [
        MANIFEST_NAME,
        "metrics.json",
        "sub/model.bin",
    ]
    assert [u for u in store.list(d) if "/_superseded/" not in u] == []
    # a second supersede keeps both generations
    store.write_bytes(f"{d}/metrics.json", b"{}")
    dest2 = supersede_previous(store, d)
    assert dest2 != dest and json.loads(store.read_bytes(f"{dest2}/metrics.json")) == {}
    assert store.exists(f"{dest}/sub/model.bin")
