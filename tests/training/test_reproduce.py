"""Reproducibility: a model partition records the Iceberg snapshot it read, and
``zipline-dagster reproduce`` trains it again at that snapshot (a new attempt, never
promoted) with the recorded metrics, even after its window was rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ctr_rows, days_ending, tables_of, write_partition, write_table
from tests.support.training import DS, TABLE, make_model, materialize, only_materialization
from tests.support.training import resources as model_resources
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.resources import LocalLauncherResource
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.training.reproduce import ReproduceError, reproduce


def test_reproduce_trains_at_the_recorded_snapshot_into_an_unpromoted_attempt(
    file_base: str, trainer_copy: Path
) -> None:
    window = days_ending(DS, 4)
    write_table(file_base, TABLE, window, rows=400)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    result = materialize(model, model_resources(None, file_base))
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    held = tables_of(file_base).days(TABLE)
    newest = max((held[d] for d in window), key=lambda d: d.sequence)
    assert md["input_snapshot_id"] == str(newest.snapshot_id)  # the window's snapshot
    store = blob_store(file_base)
    model_dir = f"{file_base}/models/listing_ctr_model/{version}/{DS}"
    trained = model_partition(store, model_dir)
    manifest = trained.manifest
    assert trained.committed and manifest is not None
    assert manifest.snapshot_id == newest.snapshot_id
    assert manifest.input["metadata"] == md["input_table_metadata"]

    # the window is rewritten since: a reproduction still reads what the model read
    write_partition(file_base, TABLE, window[2], ctr_rows(window[2], 50, seed=9))
    done = reproduce(model, DS, tables_warehouse(file_base), LocalLauncherResource(timeout_s=300))
    assert done.snapshot_id == newest.snapshot_id
    assert done.attempt_dir.startswith(f"{model_dir}/_attempts/")
    compared = {name: (was, now) for name, was, now in done.metrics}
    assert compared["holdout_auc"][0] is not None
    for name, (was, now) in compared.items():
        assert now == pytest.approx(was, rel=1e-6, abs=1e-9), name
    lines = done.lines()
    assert lines[0].startswith(
        f"listing_ctr_model {DS}: retrained at snapshot {newest.snapshot_id}"
    )
    assert any(line.startswith("holdout_auc") for line in lines)
    # not promoted: the partition's manifest is the one it had
    assert model_partition(store, model_dir).manifest == manifest


def test_reproducing_an_untrained_partition_names_it(file_base: str) -> None:
    model = make_model("0" * 12, file_base)
    with pytest.raises(ReproduceError) as err:
        reproduce(model, DS, tables_warehouse(file_base), LocalLauncherResource())
    assert f"model 'listing_ctr_model' partition {DS} is not trained: no complete manifest" in (
        str(err.value)
    )


def tables_warehouse(base: str):  # type: ignore[no-untyped-def]
    from zipline_dagster.storage.resources import WarehouseResource

    return WarehouseResource(uri=base)
