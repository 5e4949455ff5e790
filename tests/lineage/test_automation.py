"""Retraining without a person, evaluated by Dagster's own automation engine."""

from __future__ import annotations

import dataclasses
import datetime as dt

import dagster as dg

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster.declarations.versions import model_code_version
from zipline_dagster.definitions import build_definitions
from zipline_dagster.defs import defs as code_location
from zipline_dagster.defs.resources import resources
from zipline_dagster.storage.days import days_between

NOW = dt.datetime(2026, 7, 15, 6, 0, tzinfo=dt.UTC)  # latest daily partition: 2026-07-14
MODEL = dg.AssetKey(["models", "listing_ctr_model"])
TRAINING = dg.AssetKey(["ctr", "training_v1"])


def demo_defs(version: str = demo.LISTING_CTR_MODEL_VERSION) -> dg.Definitions:
    model = dataclasses.replace(demo.listing_ctr_model, version=version)
    return build_definitions(
        sources=[demo.listing_views],
        producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
        models=[model],
        resources=resources(),
    )


def materialize_report(
    instance: dg.DagsterInstance, key: dg.AssetKey, days: list[str], code_version: str | None = None
) -> None:
    """Record materializations as the runs would (no Spark or Ray needed to test automation)."""
    for ds in days:
        tags = {"dagster/code_version": code_version} if code_version else None
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=key, partition=ds, tags=tags)
        )


def requested(result: dg.EvaluateAutomationConditionsResult, key: dg.AssetKey) -> set[str]:
    return set(result.get_requested_partitions(key))


def seeded_instance() -> dg.DagsterInstance:
    instance = dg.DagsterInstance.ephemeral()
    days = days_between("2026-07-01", "2026-07-14")
    for key in (
        ["ctr", "listing_views"],
        ["ctr", "listing_features_v1"],
        ["ctr", "labels_v1"],
        ["ctr", "training_v1"],
    ):
        materialize_report(instance, dg.AssetKey(key), days)
    materialize_report(
        instance,
        MODEL,
        days_between("2026-07-11", "2026-07-14"),
        model_code_version(demo.listing_ctr_model),
    )
    return instance


def test_rematerialized_upstream_partition_requests_exactly_the_windows_containing_it() -> None:
    instance = seeded_instance()
    defs = demo_defs()
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=NOW)
    quiet = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=NOW, cursor=first.cursor
    )
    assert quiet.total_requested == 0  # nothing changed since the last tick

    materialize_report(instance, TRAINING, ["2026-07-12"])  # e.g. a feature fix recomputed one day
    result = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=NOW, cursor=quiet.cursor
    )
    # 4-day windows containing 2026-07-12 end on 07-12 .. 07-15; 07-15 does not exist yet.
    assert requested(result, MODEL) == {"2026-07-12", "2026-07-13", "2026-07-14"}
    assert result.total_requested == 3  # nothing else


def test_old_partition_change_retrains_old_models_too() -> None:
    instance = seeded_instance()
    defs = demo_defs()
    c = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=NOW).cursor
    materialize_report(instance, TRAINING, ["2026-07-09"])
    result = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=NOW, cursor=c
    )
    # windows ending 07-09..07-12 contain 07-09: the trained ones (07-11, 07-12) are
    # retrained; 07-09 and 07-10 were never trained, and filling old gaps is a backfill's
    assert requested(result, MODEL) == {"2026-07-11", "2026-07-12"}


def test_a_new_days_inputs_train_the_new_partition_but_old_days_fill_no_gaps() -> None:
    """A new day's training table arrives: the model's latest partition, never trained,
    is requested. Old upstream days written by a backfill (listing views a week back, for
    the features' windows) request nothing downstream that the backfill did not ask for."""
    instance = seeded_instance()
    defs = demo_defs()
    later = NOW + dt.timedelta(days=1)  # latest daily partition: 2026-07-15
    c = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=later)
    materialize_report(instance, TRAINING, ["2026-07-15"])
    result = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=later, cursor=c.cursor
    )
    assert requested(result, MODEL) == {"2026-07-15"}
    views = dg.AssetKey(["ctr", "listing_views"])
    materialize_report(instance, views, days_between("2026-06-24", "2026-06-30"))
    old = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=later, cursor=result.cursor
    )
    assert old.total_requested == 0


def test_version_change_requests_the_latest_partition() -> None:
    instance = seeded_instance()
    c = dg.evaluate_automation_conditions(
        defs=demo_defs(), instance=instance, evaluation_time=NOW
    ).cursor
    c = dg.evaluate_automation_conditions(
        defs=demo_defs(), instance=instance, evaluation_time=NOW, cursor=c
    ).cursor
    bumped = demo_defs(version="0123456789ab")
    result = dg.evaluate_automation_conditions(
        defs=bumped, instance=instance, evaluation_time=NOW, cursor=c
    )
    assert requested(result, MODEL) == {"2026-07-14"}
    assert result.total_requested == 1


def test_automation_sensor_is_on_by_default() -> None:
    sensor = code_location.resolve_sensor_def("zipline_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_the_champion_follows_every_model_materialization_whatever_ran_it() -> None:
    """Model partitions materialized while no daemon ran (a CLI backfill, `make demo`) are
    seen by the champion sensor at its first tick: it compares the model's newest
    materialization with the champion's last evaluation, not ticks. Once the champion is
    evaluated it requests nothing until a model partition is materialized again."""
    instance = seeded_instance()
    defs = demo_defs()
    champion = dg.AssetKey(["champions", "listing_ctr_model"])
    sensor = defs.resolve_sensor_def("zipline_champions")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING

    def requests() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        return list(sensor.evaluate_tick(context).run_requests or [])

    def newest(key: dg.AssetKey) -> int:
        found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1)
        return found.records[0].storage_id

    (first,) = requests()
    assert first.asset_selection == [champion]
    assert first.run_key == f"listing_ctr_model-{newest(MODEL)}"
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=champion))
    assert requests() == []
    materialize_report(instance, MODEL, ["2026-07-12"], demo.LISTING_CTR_MODEL_VERSION)
    (again,) = requests()
    assert again.run_key == f"listing_ctr_model-{newest(MODEL)}" != first.run_key


def test_the_champion_a_backfill_targets_is_left_to_that_backfill() -> None:
    """While a backfill that targets the champion is in progress (the UI's or
    `zipline-dagster backfill`'s: models, then their champion), model partitions it
    materialized do not make the sensor evaluate the champion too (a second run, whose
    "stays at ..." would be the backfill's last word on it); once the backfill has ended,
    a model materialized meanwhile is seen at the next tick."""
    from dagster._core.execution.backfill import BulkActionStatus  # no public way to end one

    from zipline_dagster.lineage.backfill import Plan
    from zipline_dagster.lineage.internals import launch_backfill

    instance = seeded_instance()
    defs = demo_defs()
    champion = dg.AssetKey(["champions", "listing_ctr_model"])
    sensor = defs.resolve_sensor_def("zipline_champions")

    def requests() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        return list(sensor.evaluate_tick(context).run_requests or [])

    plan = Plan(steps=[(MODEL, ["2026-07-15"])], reasons={(MODEL, "2026-07-15"): "missing"})
    backfill_id = launch_backfill(defs, instance, plan, title="models", also=[champion])
    assert requests() == []
    instance.update_backfill(
        instance.get_backfill(backfill_id).with_status(BulkActionStatus.COMPLETED_SUCCESS)
    )
    (after,) = requests()
    assert after.asset_selection == [champion]


def test_a_day_an_older_partition_scored_is_scored_again_when_that_partition_is_retrained() -> None:
    """Day ds is scored by the newest partition at or before ds-1 passing its gates, so
    when ds-1 failed them an older partition d0 scored it. Dagster's lineage maps ds to
    ds-1 only: retraining d0 makes its automation re-request day d0+1, and the
    `zipline_rescoring` sensor the later days d0 scored, with their monitoring; once."""
    from zipline_dagster.scoring.monitoring import monitoring_asset_key

    instance = seeded_instance()
    defs = build_definitions(
        sources=[demo.listing_views],
        producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
        models=[demo.listing_ctr_model],
        transforms=[demo.listing_scores],
        resources=resources(),
    )
    scores = dg.AssetKey(["ctr", "listing_ctr_model_scores"])
    sensor = defs.resolve_sensor_def("zipline_rescoring")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    cursor: list[str | None] = [None]

    def requests() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(instance=instance, definitions=defs, cursor=cursor[0])
        tick = sensor.evaluate_tick(context)
        cursor[0] = tick.cursor
        return list(tick.run_requests or [])

    # 07-12 failed its gates: 07-13 was scored by 07-11, as 07-12 was; 07-14 by 07-13
    for day, used in [("2026-07-12", "2026-07-11"), ("2026-07-13", "2026-07-11"),
                      ("2026-07-14", "2026-07-13")]:  # fmt: skip
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=scores, partition=day, metadata={"model_ds": used})
        )
    assert requests() == []  # every day was scored after the partition that scored it
    materialize_report(instance, MODEL, ["2026-07-11"], demo.LISTING_CTR_MODEL_VERSION)
    # while a backfill of the scores is in progress, it is left to score what it planned
    from dagster._core.execution.backfill import BulkActionStatus  # no public way to end one

    from zipline_dagster.lineage.backfill import Plan
    from zipline_dagster.lineage.internals import launch_backfill

    plan = Plan(steps=[(scores, ["2026-07-15"])], reasons={(scores, "2026-07-15"): "missing"})
    backfill_id = launch_backfill(defs, instance, plan, title="scores")
    assert requests() == []
    instance.update_backfill(
        instance.get_backfill(backfill_id).with_status(BulkActionStatus.COMPLETED_SUCCESS)
    )
    (again,) = requests()
    assert again.partition_key == "2026-07-13"
    assert again.asset_selection == [scores, monitoring_asset_key(demo.listing_scores)]
    assert requests() == []


def test_a_partition_updated_after_its_input_in_the_same_tick_is_not_requested() -> None:
    """An input and the partitions reading it updated between two ticks, the partitions
    last (one run computed both, as a scores day and its monitoring): nothing to redo."""
    instance = seeded_instance()
    defs = demo_defs()
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=NOW)
    materialize_report(instance, TRAINING, ["2026-07-12"])
    materialize_report(
        instance, MODEL, ["2026-07-12", "2026-07-13", "2026-07-14"], demo.LISTING_CTR_MODEL_VERSION
    )
    result = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=NOW, cursor=first.cursor
    )
    assert requested(result, MODEL) == set()
