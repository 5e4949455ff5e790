"""A scores day read and scored batch by batch: several files, one Iceberg commit, the
same scores and drift as a day scored whole."""

from __future__ import annotations

import io
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
from zipline_runtime import stats

from tests.helpers import days_ending, tables_of
from tests.support.scoring import D1, D2, booster_scores, scoring_defs, write_days
from tests.support.training import TABLE
from zipline_dagster.lineage.partitions import table_asset_key
from zipline_dagster.scoring.drift import PREDICTIONS_PSI, PSI_PREFIX
from zipline_dagster.storage.blobs import blob_store


def test_a_day_scored_in_batches_is_committed_in_one_snapshot(
    file_base: str, trainer_copy: Path
) -> None:
    write_days(file_base, days_ending(D2, 5), rows=300)
    # 300 rows in batches of 70: five batches, four to a file
    version, model, t, defs = scoring_defs(trainer_copy, file_base, None, batch_rows=70)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    assert job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(["models", model.name])], partition_key=D1
    ).success
    tables = tables_of(file_base)
    result = job.execute_in_process(
        instance=instance, asset_selection=[table_asset_key(t.table)], partition_key=D2
    )
    assert result.success
    table = tables.load(t.table)
    assert table is not None and len(table.snapshots()) == 1  # one commit for the day
    files = tables.days(t.table)[D2].files
    assert len(files) == 2, files
    store = blob_store(file_base)
    parts = [pq.read_table(io.BytesIO(store.read_bytes(f))) for f in files]
    assert sorted(p.num_rows for p in parts) == [20, 280]
    scores = np.concatenate([p.column("score").to_numpy() for p in parts])

    # the scores are the booster's on the day's rows, in their order
    source = tables.days(TABLE)[D2].files
    rows = pq.read_table(io.BytesIO(store.read_bytes(source[0]))).to_pandas()
    model_dir = Path(file_base[len("file://") :]) / "models" / model.name / version / D1
    expected = booster_scores(model_dir, rows)
    ordered = sorted(parts, key=lambda p: -p.num_rows)  # part-00000 holds the first rows
    listing = np.concatenate([p.column("listing_id").to_numpy() for p in ordered])
    np.testing.assert_array_equal(listing, rows["listing_id"].to_numpy())
    np.testing.assert_allclose(
        np.concatenate([p.column("score").to_numpy() for p in ordered]), expected, rtol=1e-6
    )
    assert len(scores) == 300

    # the day's drift, counted batch by batch, is the one a whole-day count gives
    report = json.loads((model_dir / "metrics.json").read_text())
    whole = stats.drift_of(
        report["drift_reference"],
        rows,
        {"price_log": "price_log", "inventory_count": "inventory_count"},
        expected.astype(np.float64),
    )
    (mat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in result.get_asset_materialization_events()
    ]
    md = {k: v.value for k, v in mat.metadata.items()}
    assert md["rows"] == 300
    assert md[PREDICTIONS_PSI] == whole["predictions"] is not None
    assert whole["features"] and all(
        md[f"{PSI_PREFIX}{name}"] == value for name, value in whole["features"].items()
    )
