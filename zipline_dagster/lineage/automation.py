"""Retraining without a person: automation conditions and the sensor that evaluates them."""

import dagster as dg


def retrain_condition() -> dg.AutomationCondition:
    """Request a partition again when its inputs change or its code version does.

    * any partition of its window was (re-)materialized, e.g. a feature fix: exactly the
      materialized partitions whose window contains it are requested, old ones included
      (``eager()`` would only look at the latest partition), and the latest partition,
      materialized or not (a new day's data arrived);
    * the code version changed (a new trainer version): the latest partition is retrained.
    Never while one of its inputs is missing or still being computed. An older partition
    never materialized is not automation's to fill: a backfill plans it, upstream first
    (``zipline-dagster backfill``), and the old upstream days that backfill writes request
    nothing of what it did not ask for.
    """
    upstream_changed = (
        # since the partition was last requested or updated: an input and the partition
        # updated in one run (scores, then their monitoring) request nothing; an input
        # updated while another was in progress requests the partition once none is
        dg.AutomationCondition.any_deps_updated().since_last_handled()
        & (~dg.AutomationCondition.missing() | dg.AutomationCondition.in_latest_time_window())
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
    ).with_label("an input partition was updated")
    version_changed = (
        dg.AutomationCondition.code_version_changed()
        & dg.AutomationCondition.in_latest_time_window()
        & ~dg.AutomationCondition.any_deps_missing()
    ).with_label("code version changed (latest partition)")
    return (
        (upstream_changed | version_changed) & ~dg.AutomationCondition.in_progress()
    ).with_label("retrain on input or version change")


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        "zipline_automation",
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Evaluates the retrain conditions of features, tables and models.",
    )
