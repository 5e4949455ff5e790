"""Batch scoring (ModelTransforms) and monitoring on a real local Ray cluster: day ds is
scored by the model of ds-1 from the trainer archive's inference module, re-runs are
bit-identical, retraining a model partition makes exactly the scores it served stale,
and the realized metrics equal an independent pandas/scikit-learn computation."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import xgboost as xgb
from sklearn.metrics import log_loss, roc_auc_score

from tests.helpers import ctr_rows, days_ending, write_partition
from tests.training.test_assets import TABLE, make_model, resources
from zipline_dagster import EventSource, ModelSpecError, ModelTransforms
from zipline_dagster.lineage.backfill import FreshnessResolver
from zipline_dagster.lineage.partitions import table_asset_key
from zipline_dagster.lineage.registry import ExternalTable, build_definitions
from zipline_dagster.scoring.monitoring import monitoring_asset_key
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.tables import committed_partitions
from zipline_dagster.training.archive import publish_trainer_archive

LABELS = "ctr.labels_t"
D1, D2, D3 = "2026-09-10", "2026-09-11", "2026-09-12"


def transforms_for(model: Any) -> ModelTransforms:
    return ModelTransforms(
        sources=[EventSource(table=TABLE)],
        models=[model],
        passthrough_fields=["listing_id"],
        output_namespace="ctr",
        labels=EventSource(table=LABELS),
        label_keys=["listing_id"],
    )


def test_model_transforms_is_validated_at_load() -> None:
    model = make_model("0123456789ab", "file:///tmp/x")
    with pytest.raises(ModelSpecError, match="collides with a column"):
        ModelTransforms(
            sources=[EventSource(TABLE)],
            models=[model],
            passthrough_fields=["score"],
            output_namespace="ctr",
        )
    with pytest.raises(ModelSpecError, match=r"label_keys \['view_id'\] are not passthrough"):
        ModelTransforms(
            sources=[EventSource(TABLE)],
            models=[model],
            passthrough_fields=["listing_id"],
            output_namespace="ctr",
            labels=EventSource(LABELS),
            label_keys=["view_id"],
        )
    other = make_model("0123456789ab", "file:///tmp/x", name="other_model")
    with pytest.raises(ModelSpecError, match="not among the models of these definitions"):
        build_definitions(
            external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
            models=[other],
            transforms=[transforms_for(model)],
            automation=False,
        )


def read_partition(base: str, table: str, ds: str) -> tuple[list[str], pd.DataFrame]:
    store = blob_store(base)
    files = committed_partitions(store, base, table)[ds]
    frames = [pq.read_table(io.BytesIO(store.read_bytes(f))).to_pandas() for f in files]
    return files, pd.concat(frames, ignore_index=True)


def test_scores_served_by_the_day_before_and_monitored(
    ray_head: Any, file_base: str, trainer_copy: Path
) -> None:
    for ds in days_ending(D3, 6):
        rows = ctr_rows(ds, 300)
        write_partition(file_base, TABLE, ds, rows)
        write_partition(file_base, LABELS, ds, rows[["listing_id", "label"]])
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    t = transforms_for(model)
    defs = build_definitions(
        external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
        models=[model],
        transforms=[t],
        resources=resources(ray_head.dashboard_url, file_base),
        automation=False,
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    model_key = dg.AssetKey(["models", model.name])
    scores_key = table_asset_key(t.table)

    def run(key: dg.AssetKey, ds: str) -> dg.ExecuteInProcessResult:
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )
        assert result.success, [
            f.step_failure_data.error.to_string()  # type: ignore[union-attr]
            for f in result.get_step_failure_events()
        ]
        return result

    run(model_key, D1)
    run(model_key, D2)
    first = run(scores_key, D2)
    run(scores_key, D3)

    # Day D2 is scored by partition D1 from the archive's trainer.score: exactly the
    # booster's predictions on D2's source rows, with its version and day.
    files, scores = read_partition(file_base, t.table, D2)
    assert list(scores.columns) == ["listing_id", "score", "model_version", "model_ds"]
    _, source = read_partition(file_base, TABLE, D2)
    model_dir = Path(file_base[len("file://") :]) / "models" / model.name / version / D1
    booster = xgb.Booster()
    booster.load_model(str(model_dir / "model.json"))
    expected = booster.predict(
        xgb.DMatrix(
            source[["price_log", "inventory_count"]].to_numpy(dtype=float),
            feature_names=["price_log", "inventory_count"],
        )
    )
    assert scores["listing_id"].tolist() == source["listing_id"].tolist()
    np.testing.assert_array_equal(scores["score"].to_numpy(), expected.astype(np.float64))
    assert set(scores["model_version"]) == {version} and set(scores["model_ds"]) == {D1}
    (mat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in first.get_asset_materialization_events()
    ]
    assert mat.metadata["model_ds"].value == D1 and mat.metadata["rows"].value == 300
    _, d3 = read_partition(file_base, t.table, D3)
    assert set(d3["model_ds"]) == {D2}

    # A re-run gives the same bytes (a new file, committed in place of the old one).
    store = blob_store(file_base)
    before = store.read_bytes(files[0])
    run(scores_key, D2)
    files_again, _ = read_partition(file_base, t.table, D2)
    assert files_again != files and store.read_bytes(files_again[0]) == before
    assert not store.exists(files[0])

    # Monitoring: realized metrics equal an independent computation.
    monitored = run(monitoring_asset_key(t), D2)
    (mmat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in monitored.get_asset_materialization_events()
    ]
    _, labels = read_partition(file_base, LABELS, D2)
    joined = scores.merge(labels, on="listing_id")
    assert mmat.metadata["rows_joined"].value == 300
    assert mmat.metadata["realized/auc"].value == pytest.approx(
        roc_auc_score(joined["label"], joined["score"]), abs=1e-12
    )
    assert mmat.metadata["realized/logloss"].value == pytest.approx(
        log_loss(joined["label"], joined["score"], labels=[0, 1]), abs=1e-12
    )
    assert mmat.metadata["realized/positive_rate"].value == pytest.approx(joined["label"].mean())
    report = json.loads((model_dir / "metrics.json").read_text())
    assert mmat.metadata["training/holdout_auc"].value == report["holdout"]["metrics"]["auc"]
    (check,) = monitored.get_asset_check_evaluations()
    assert check.check_name == "realized_auc" and check.metadata["realized_auc"].value == (
        mmat.metadata["realized/auc"].value
    )

    # Retraining model partition D1 makes exactly the scores it served stale.
    graph = defs.resolve_asset_graph()
    fresh = FreshnessResolver(instance, graph)
    assert fresh.status(scores_key, D2) == "fresh" and fresh.status(scores_key, D3) == "fresh"
    run(model_key, D1)
    after = FreshnessResolver(instance, graph)
    assert after.status(scores_key, D2).startswith("stale: upstream models/listing_ctr_model")
    assert after.status(scores_key, D3) == "fresh"
