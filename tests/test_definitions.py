"""Every input table resolves by its exact name; near misses fail when the code location loads."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType

import zipline_dagster.defs.listing_ctr as demo
from tests.support.definitions import defs_with
from zipline_dagster import EventSource, ModelSpecError
from zipline_dagster.declarations.features import StagingQuery
from zipline_dagster.declarations.versions import model_code_version
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.defs import defs as code_location
from zipline_dagster.defs.resources import resources


def model_reading(table: str) -> object:
    conf = dataclasses.replace(
        demo.listing_ctr_model.training_conf, training_data_source=EventSource(table=table)
    )
    return dataclasses.replace(demo.listing_ctr_model, training_conf=conf)


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
    # the trainer version, then the hash of the declaration (table, columns, window, flags)
    assert node.code_version == model_code_version(demo.listing_ctr_model)
    assert node.code_version.startswith(demo.LISTING_CTR_MODEL_VERSION + "-")
    # trainings share one Dagster pool, which a deployment limits (make cluster-up: 2)
    assert node.pools == {"zipline_training"}
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
    # (every model's: the demo's price model too)
    pdefs = {
        graph.get(k).partitions_def
        for k in graph.get_all_asset_keys()
        if k.path[0] not in ("models", "champions", "monitoring")
        and not k.path[-1].endswith("_scores")
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


def test_an_external_table_observed_again_unchanged_retrains_nothing(file_base: str) -> None:
    """Observing an external table records a data version per committed day. Observed
    again with nothing changed, every version is the same and the planner finds the
    models trained on it fresh (before, every observation made them stale: a click on
    "Observe sources" retrained every model day). A day rewritten with other rows gets
    a new version, and exactly the model days whose window holds it are stale."""
    from dagster._core.definitions.observe import observe

    from tests.conftest import TRAINERS
    from tests.helpers import ctr_rows, days_ending, write_partition
    from tests.support.training import TABLE, make_model
    from tests.support.training import resources as test_resources
    from zipline_dagster.definitions import build_external_table_asset
    from zipline_dagster.jobs.archive import publish_trainer_archive
    from zipline_dagster.lineage.backfill import plan_backfill
    from zipline_dagster.lineage.freshness import FreshnessResolver
    from zipline_dagster.storage.days import shift_day

    first, last = "2026-07-10", "2026-07-11"  # model days; windows 07-07..07-10, ..07-11
    for ds in days_ending(last, 5):
        write_partition(file_base, TABLE, ds, ctr_rows(ds, 200))
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    res = test_resources(None, file_base)  # the local launcher: no Ray needed here
    defs = build_definitions(
        external_tables=[ExternalTable(TABLE)], models=[model], resources=res, automation=False
    )
    instance = dg.DagsterInstance.ephemeral()
    source = build_external_table_asset(ExternalTable(TABLE))
    source_key = dg.AssetKey(TABLE.split("."))

    def observed() -> dict[str, str]:
        assert observe([source], instance=instance, resources={"warehouse": res["warehouse"]})
        tags = instance.event_log_storage.get_latest_tags_by_partition(
            source_key,
            DagsterEventType.ASSET_OBSERVATION,
            ["dagster/data_version"],
        )
        return {p: t["dagster/data_version"] for p, t in tags.items()}

    versions = observed()
    assert sorted(versions) == days_ending(last, 5)
    key = dg.AssetKey(["models", model.name])
    job = defs.resolve_implicit_global_asset_job_def()
    for ds in (first, last):
        assert job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds
        ).success
    graph = defs.resolve_asset_graph()

    assert observed() == versions  # nothing changed: the same versions
    assert plan_backfill(defs, instance, key, [first, last]).empty

    write_partition(file_base, TABLE, last, ctr_rows(shift_day(last, 7), 200))  # other rows
    again = observed()
    assert again[last] != versions[last]
    assert {d: v for d, v in again.items() if d != last} == {
        d: v for d, v in versions.items() if d != last
    }
    fresh = FreshnessResolver(instance, graph)
    assert fresh.status(key, first).fresh  # its window ends the day before
    assert str(fresh.status(key, last)) == (
        f"stale: upstream {TABLE.replace('.', '/')} {last} was updated after it "
        "(its observed data version changed)"
    )
    plan = plan_backfill(defs, instance, key, [first, last])
    assert plan.steps == [(key, [last])]


@pytest.mark.s3
def test_observing_an_external_table_reads_no_data_file(
    s3_bucket: str, s3_env: dict[str, str]
) -> None:
    """A day's data version is the Iceberg snapshot that last wrote it, read from the
    table's metadata: observing a table of any size costs its metadata files, not its
    bytes. A day written again changes that day's version only."""
    from collections import Counter

    from tests.helpers import ctr_rows, days_ending, s3_requests, tables_of, write_partition
    from tests.support.training import TABLE
    from zipline_dagster.definitions import observed_versions

    base = f"{s3_bucket}/wh"
    days = days_ending("2026-07-10", 3)
    for ds in days:
        write_partition(base, TABLE, ds, ctr_rows(ds, 5_000))
    tables = tables_of(base)
    with s3_requests(s3_env["AWS_ENDPOINT_URL"]) as requests:
        versions = observed_versions(tables, TABLE)
    assert sorted(versions) == days
    assert versions == {ds: str(d.snapshot_id) for ds, d in tables.days(TABLE).items()}
    read = Counter(name.rsplit(".", 1)[-1] for _, name in requests)
    assert "parquet" not in read and read["avro"] >= 1, read  # metadata only
    assert observed_versions(tables, TABLE) == versions

    write_partition(base, TABLE, days[1], ctr_rows(days[1], 10))
    again = observed_versions(tables, TABLE)
    assert [d for d in days if again[d] != versions[d]] == [days[1]]


def test_every_warehouse_table_shows_the_iceberg_kind() -> None:
    """Sources, features, labels, training tables and scores tables are all Iceberg
    tables: each one's kind badge in the UI says so (a scores table said "parquet")."""
    import zipline_dagster.defs as demo

    tables = {
        s.key.to_user_string(): s.kinds
        for s in demo.defs.resolve_all_asset_specs()
        if "zipline/table" in s.metadata
    }
    assert "ctr/listing_ctr_model_scores" in tables and "ctr/training_v1" in tables
    assert {key for key, kinds in tables.items() if "iceberg" not in kinds} == set()
    assert {key for key, kinds in tables.items() if "parquet" in kinds} == set()
