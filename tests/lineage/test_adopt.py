"""Storage is the truth: a Dagster instance that does not know what the warehouse holds
(a new instance over an existing warehouse, or one restored from a backup taken before a
backfill) adopts it. Its next plan records every committed table day and model partition
from the catalog and the manifests, says so in their metadata, and recomputes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, run_days, write_partition
from tests.support.training import TABLE, make_model, resources
from zipline_dagster.declarations.features import StagingQuery
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.lineage.backfill import plan_backfill
from zipline_dagster.lineage.ledger import RECORDED_FROM_STORAGE
from zipline_dagster.lineage.partitions import latest_materialization

pytestmark = pytest.mark.spark
RAW, DS = "ctr.raw_views", "2026-07-10"


def instance_at(home: Path) -> dg.DagsterInstance:
    home.mkdir(parents=True, exist_ok=True)
    return dg.DagsterInstance.local_temp(str(home))


def test_an_instance_restored_from_a_backup_adopts_the_warehouse(
    spark_resource: Any, file_base: str, tmp_path: Path
) -> None:
    window = days_ending(DS, 4)
    for day in days_ending(DS, 5):
        write_partition(file_base, RAW, day, ctr_rows(day, 200))
    producer = StagingQuery(
        name="training_v1",
        table=TABLE,
        query=f"SELECT * FROM {RAW} WHERE ds BETWEEN '{{{{ start_date }}}}' AND '{{{{ end_date }}}}'",
        dependencies=[RAW],
    )
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    defs = build_definitions(
        external_tables=[ExternalTable(RAW)],
        producers=[producer],
        models=[model],
        resources={**resources(None, file_base), "spark": spark_resource},
        automation=False,
    )
    job = defs.resolve_implicit_global_asset_job_def()
    table_key, model_key = dg.AssetKey(TABLE.split(".")), dg.AssetKey(["models", model.name])
    live = instance_at(tmp_path / "live")
    # the backup: the instance as it was before the backfill (it knows nothing of it)
    shutil.copytree(tmp_path / "live", tmp_path / "backup")
    assert run_days(job, live, table_key, window[0], window[-1]).success
    trained = job.execute_in_process(instance=live, asset_selection=[model_key], partition_key=DS)
    assert trained.success
    live_plan = plan_backfill(defs, live, model_key, [DS])
    assert live_plan.empty, live_plan.describe()

    restored = instance_at(tmp_path / "backup")
    assert latest_materialization(restored, model_key, DS) is None
    plan = plan_backfill(defs, restored, model_key, [DS])
    assert plan.empty, plan.describe()  # nothing recomputed, nothing retrained
    for key, part in [(table_key, d) for d in window] + [(model_key, DS)]:
        record = latest_materialization(restored, key, part)
        assert record is not None and record.asset_materialization is not None, (key, part)
        said = record.asset_materialization.metadata[RECORDED_FROM_STORAGE].value
        assert "recorded from storage" in str(said), said
    # what the restored instance recorded is what the live one did
    for d in window:
        live_md = latest_materialization(live, table_key, d).asset_materialization.metadata  # type: ignore[union-attr]
        got = latest_materialization(restored, table_key, d).asset_materialization.metadata  # type: ignore[union-attr]
        assert got["write_id"].value == live_md["write_id"].value
    # a second plan finds them fresh: each was recorded once
    assert plan_backfill(defs, restored, model_key, [DS]).empty
    for d in window:
        records = restored.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=table_key, asset_partitions=[d]), limit=10
        ).records
        assert len(records) == 1, d
