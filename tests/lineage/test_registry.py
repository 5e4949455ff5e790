"""Every input table resolves by its exact name; near misses fail when the code location loads."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster import EventSource, ModelSpecError
from zipline_dagster.declarations.features import StagingQuery
from zipline_dagster.defs import defs as code_location
from zipline_dagster.defs.resources import resources
from zipline_dagster.lineage.registry import ExternalTable, build_definitions


def model_reading(table: str) -> object:
    conf = dataclasses.replace(
        demo.listing_ctr_model.training_conf, training_data_source=EventSource(table=table)
    )
    return dataclasses.replace(demo.listing_ctr_model, training_conf=conf)


def defs_with(model: object, **kw: object) -> dg.Definitions:
    return build_definitions(
        sources=[demo.listing_views],
        producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
        models=[model],  # type: ignore[list-item]
        resources=resources(),
        **kw,  # type: ignore[arg-type]
    )


def test_catalog_qualified_near_miss_fails_with_suggestion() -> None:
    with pytest.raises(ModelSpecError) as exc:
        defs_with(model_reading("hive.ctr.training_v1"))
    msg = str(exc.value)
    assert "Model 'listing_ctr_model'" in msg
    assert "training_conf.training_data_source.table='hive.ctr.training_v1'" in msg
    assert "closest: ctr.training_v1" in msg
    assert "ExternalTable" in msg


def test_typo_near_miss_lists_closest_names() -> None:
    with pytest.raises(ModelSpecError, match=r"closest: ctr\.training_v1"):
        defs_with(model_reading("ctr.trainig_v1"))


def test_producer_input_is_checked_too() -> None:
    bad = StagingQuery(
        name="x",
        table="ctr.x",
        query="SELECT 1 AS a, '{{ ds }}' AS ds",
        dependencies=["ctr.listing_view"],
    )
    with pytest.raises(
        ModelSpecError, match=r"StagingQuery 'x'.*'ctr.listing_view'.*closest: ctr\.listing_views"
    ):
        build_definitions(sources=[demo.listing_views], producers=[bad], resources=resources())


def test_table_emitted_twice_is_refused() -> None:
    dup = dataclasses.replace(demo.ctr_labels, name="labels_copy")
    with pytest.raises(ModelSpecError, match="emitted twice"):
        build_definitions(
            sources=[demo.listing_views],
            producers=[demo.ctr_labels, dup],
            resources=resources(),
        )


def test_external_table_is_declared_explicitly_and_observed() -> None:
    defs = defs_with(
        model_reading("vendor.clicks"), external_tables=[ExternalTable("vendor.clicks")]
    )
    node = defs.resolve_asset_graph().get(dg.AssetKey(["vendor", "clicks"]))
    assert node.is_observable and not node.is_materializable
    model_deps = (
        defs.resolve_asset_graph().get(dg.AssetKey(["models", "listing_ctr_model"])).parent_keys
    )
    assert model_deps == {dg.AssetKey(["vendor", "clicks"])}


def test_model_window_mapping_and_code_version() -> None:
    graph = code_location.resolve_asset_graph()
    key = dg.AssetKey(["models", "listing_ctr_model"])
    node = graph.get(key)
    assert node.code_version == demo.LISTING_CTR_MODEL_VERSION
    mapping = graph.get_partition_mapping(key, dg.AssetKey(["ctr", "training_v1"]))
    assert isinstance(mapping, dg.TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == (-3, 0)
    # one shared partitions definition for the data; the model's days are the same daily
    # partitions from its first trainable day on (its Query.start_partition + the window),
    # its scores and their monitoring from the day after; the champion is not partitioned
    after_training = {
        dg.AssetKey(["ctr", "listing_ctr_model_scores"]),
        dg.AssetKey(["monitoring", "ctr", "listing_ctr_model_scores"]),
    }
    champion = dg.AssetKey(["champions", "listing_ctr_model"])
    assert graph.get(champion).partitions_def is None
    scored = {graph.get(k).partitions_def for k in after_training}
    assert [p.get_first_partition_key() for p in scored] == ["2026-07-05"]  # type: ignore[union-attr]
    pdefs = {
        graph.get(k).partitions_def
        for k in graph.get_all_asset_keys()
        if k not in {key, champion, *after_training}
    }
    assert len(pdefs) == 1
    (shared,) = pdefs
    model_pdef = node.partitions_def
    assert isinstance(shared, dg.TimeWindowPartitionsDefinition)
    assert isinstance(model_pdef, dg.TimeWindowPartitionsDefinition)
    assert (model_pdef.cron_schedule, model_pdef.timezone) == (
        shared.cron_schedule,
        shared.timezone,
    )
    assert model_pdef.get_first_partition_key() == "2026-07-04"  # 07-01 + a 4-day window
