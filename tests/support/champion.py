"""Champions in a test: a gated model, its partitions trained, its champion advanced."""

from __future__ import annotations

import dataclasses
from typing import Any

import dagster as dg

from tests.support.training import make_model
from zipline_dagster import DeploymentSpec, Metric, RolloutStrategy
from zipline_dagster.declarations.model import Model
from zipline_dagster.lineage.partitions import (
    daily_partitions,
    trainable_partitions,
)
from zipline_dagster.rollout.assets import (
    build_champion_asset,
    build_model_checks,
    champion_asset_key,
)
from zipline_dagster.training.assets import build_model_asset

DS1, DS2, DS3 = "2026-08-10", "2026-08-11", "2026-08-12"
THRESHOLD = 0.62


def gated(version: str, base: str) -> Model:
    return dataclasses.replace(
        make_model(version, base),
        deployment_conf=DeploymentSpec(
            rollout_strategy=RolloutStrategy(
                rollout_metric_thresholds=[Metric("holdout_auc", THRESHOLD)],
                regression_tolerance=0.1,
            )
        ),
    )


def train(model: Model, res: dict[str, Any], ds: str, instance: dg.DagsterInstance) -> Any:
    checks = build_model_checks(model, trainable_partitions(model, daily_partitions))
    return dg.materialize(
        [build_model_asset(model=model), *checks],
        partition_key=ds,
        resources=res,
        instance=instance,
        raise_on_error=False,
    )


def checks_of(result: Any) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def advance(model: Model, res: dict[str, Any], instance: dg.DagsterInstance) -> dict[str, Any]:
    result = dg.materialize([build_champion_asset(model)], resources=res, instance=instance)
    (event,) = result.get_asset_materialization_events()
    mat = event.event_specific_data.materialization  # type: ignore[union-attr]
    assert mat.asset_key == champion_asset_key(model.name)
    return {k: v.value for k, v in mat.metadata.items()}
