"""The model's training Query is honoured or refused, never ignored: ``start_partition``
bounds the trainable partitions, ``selects`` are the trainer's column projection (checked
against the producer), ``wheres`` and expressions are refused at load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import zipline_dagster.defs.listing_ctr as demo
from tests.helpers import days_ending, write_table
from tests.support.definitions import defs_with
from tests.support.trainers import run_trainer
from zipline_dagster import EventSource, ModelSpecError, Query, selects
from zipline_dagster.definitions import build_definitions
from zipline_dagster.jobs.request import (
    build_training_request,
)
from zipline_dagster.lineage.backfill import model_partitions
from zipline_dagster.lineage.freshness import BackfillError
from zipline_dagster.training.assets import build_model_asset


def with_query(query: Query, **conf: Any) -> Any:
    src = EventSource(table="ctr.training_v1", query=query)
    training = dataclasses.replace(
        demo.listing_ctr_model.training_conf, training_data_source=src, **conf
    )
    return dataclasses.replace(demo.listing_ctr_model, training_conf=training)


def test_wheres_are_refused_at_load() -> None:
    with pytest.raises(ModelSpecError) as exc:
        with_query(Query(wheres=("price > 0",)))
    msg = str(exc.value)
    assert "Model 'listing_ctr_model'" in msg and "query.wheres" in msg
    assert "filter in the producer" in msg


def test_expression_selects_are_refused_at_load() -> None:
    with pytest.raises(ModelSpecError) as exc:
        with_query(Query(selects=selects("label", price_log="ln(price)")))
    assert "selects['price_log']='ln(price)' is invalid" in str(exc.value)


def test_selected_columns_must_be_what_the_producer_emits() -> None:
    with pytest.raises(ModelSpecError) as exc:
        defs_with(with_query(Query(selects=selects("price_log", "lable"))))
    msg = str(exc.value)
    assert "names ['lable']" in msg and "Join 'training_v1'" in msg
    assert "it emits: view_id, listing_id, inventory_count, label, price_log" in msg


def test_a_label_column_flag_the_table_lacks_is_refused_at_load_with_the_closest() -> None:
    """A typo in job_configs['label-column'] fails the code location's load, not a job."""
    model = demo.listing_ctr_model
    conf = dataclasses.replace(
        model.training_conf,
        job_configs={**model.training_conf.job_configs, "label-column": "lable"},
        training_data_source=EventSource(table="ctr.training_v1"),
    )
    with pytest.raises(ModelSpecError) as exc:
        defs_with(dataclasses.replace(model, training_conf=conf))
    msg = str(exc.value)
    assert msg.startswith(
        "Model 'listing_ctr_model': training_conf.job_configs['label-column'] names ['lable'], "
        "which Join 'training_v1' does not emit into ctr.training_v1 (closest: label)"
    ), msg


def test_a_monitoring_label_column_the_labels_table_lacks_is_refused_at_load() -> None:
    """ModelTransforms(label_column=...) is checked against the labels table's columns:
    here a StagingQuery's, read from its select list."""
    scores = dataclasses.replace(demo.listing_scores, label_column="clicked")
    with pytest.raises(ModelSpecError) as exc:
        build_definitions(
            sources=[demo.listing_views],
            producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
            models=[demo.listing_ctr_model],
            transforms=[scores],
        )
    msg = str(exc.value)
    assert msg.startswith(
        "ModelTransforms of 'listing_ctr_model': label_column names ['clicked'], which "
        "StagingQuery 'labels_v1' does not emit into ctr.labels_v1"
    ), msg
    assert "it emits: view_id, listing_id, ts, price, inventory_count, label, ds" in msg


def test_selects_become_the_trainers_columns_flag() -> None:
    model = with_query(Query(selects=selects("price_log", "label")))
    flags = build_training_request(model, "2026-07-11", warehouse="file:///w").flags
    assert "--columns=price_log,label" in flags
    demo_flags = build_training_request(demo.listing_ctr_model, "2026-07-11", warehouse="file:///w")
    assert f"--columns={','.join([*demo.FEATURES, 'label'])}" in demo_flags.flags
    # without selects the trainer reads every column
    bare = with_query(Query())
    assert not any(
        f.startswith("--columns=")
        for f in build_training_request(bare, "2026-07-11", warehouse="file:///w").flags
    )


def test_start_partition_bounds_the_trainable_partitions() -> None:
    model = with_query(Query(start_partition="2026-07-05"))
    asset = build_model_asset(model=model)
    pdef = asset.partitions_def
    assert pdef is not None
    # a 4-day window ending on 07-08 starts on 07-05: the first partition the UI offers
    assert pdef.get_first_partition_key() == "2026-07-08"
    assert not pdef.has_partition_key("2026-07-07")

    defs = defs_with(model)
    key = dg.AssetKey(["models", "listing_ctr_model"])
    assert model_partitions(defs, key, "2026-07-08", "2026-07-09") == ["2026-07-08", "2026-07-09"]
    with pytest.raises(BackfillError) as exc:
        model_partitions(defs, key, "2026-07-06", "2026-07-09")
    msg = str(exc.value)
    assert "--start-ds='2026-07-06' is not a partition of models/listing_ctr_model" in msg
    assert "accepted: days 2026-07-08.." in msg
    assert "start_partition is 2026-07-05" in msg


def test_invalid_start_partition_day_refused() -> None:
    with pytest.raises(ModelSpecError, match="start_partition='2026-02-30'"):
        Query(start_partition="2026-02-30")


def test_reference_trainer_reads_only_the_selected_columns(file_base: str, tmp_path: Path) -> None:
    ds = "2026-07-10"
    write_table(file_base, "ctr.training_v1", days_ending(ds, 3), rows=300)
    common = (
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-08",
        f"--end-ds={ds}",
        f"--warehouse={file_base}",
        "--eval-days=1",
    )
    out = tmp_path / "out"
    res = run_trainer(*common, f"--model-dir={out.as_uri()}", "--columns=price_log,label")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((out / "metrics.json").read_text())
    # the table also has listing_id and inventory_count: not read, so not features
    assert [f["feature"] for f in report["feature_importance"]] == ["price_log"]

    bad = run_trainer(
        *common, f"--model-dir={(tmp_path / 'bad').as_uri()}", "--columns=price_log,no_such"
    )
    assert bad.returncode != 0
    assert "has no columns ['no_such'] (--columns)" in bad.stdout + bad.stderr
