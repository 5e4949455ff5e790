"""Monitoring computes the realized metrics of the model's task, compared with the holdout
value of the same metric; a label that does not fit the task is one clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster import ModelSpecError
from zipline_dagster.declarations.tasks import Task
from zipline_dagster.scoring.monitoring import (
    MonitoringError,
    build_monitoring_checks,
    monitored_task,
    realized_check,
    realized_metrics,
)


def frames(y: list[float], p: list[float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = np.arange(len(y))
    return pd.DataFrame({"id": ids, "score": p}), pd.DataFrame({"id": ids, "y": y})


def test_a_regression_days_realized_rmse_mae_and_r2() -> None:
    rng = np.random.default_rng(3)
    y = rng.normal(4.0, 0.5, 200)
    p = y + rng.normal(0.0, 0.2, 200)
    scores, labels = frames(list(y), list(p))
    m = realized_metrics(scores, labels, ["id"], "y", Task.REGRESSION)
    assert m["rmse"] == pytest.approx(np.sqrt(mean_squared_error(y, p)), abs=1e-12)
    assert m["mae"] == pytest.approx(mean_absolute_error(y, p), abs=1e-12)
    assert m["r2"] == pytest.approx(r2_score(y, p), abs=1e-12)
    assert "auc" not in m and m["rows_joined"] == 200
    # one label value everywhere: R² is undefined and says why
    flat = realized_metrics(*frames([2.0] * 5, [1.0] * 5), ["id"], "y", Task.REGRESSION)
    assert flat["r2"] is None and flat["status"]["r2"].startswith("every labelled row has")


def test_a_continuous_label_under_classification_is_one_clear_error() -> None:
    """Before, log loss raised 'y_prob contains values greater than 1' mid-step."""
    with pytest.raises(MonitoringError) as exc:
        realized_metrics(
            *frames([3.7, 0.0, 1.0], [0.2, 0.4, 0.9]), ["id"], "y", Task.CLASSIFICATION
        )
    assert str(exc.value) == (
        "the label column 'y' holds 3.7 besides 0 and 1: a classifier's label is 0 or 1 (a "
        "continuous label is a regression's: declare Model(task='regression'))"
    )


def regression_scores() -> object:
    model = dataclasses.replace(demo.listing_ctr_model, task="regression", deployment_conf=None)
    return dataclasses.replace(demo.listing_scores, models=[model])


def test_a_regression_models_checks_are_its_tasks_and_judge_the_right_direction() -> None:
    t = regression_scores()
    (checks,) = build_monitoring_checks(t)  # type: ignore[arg-type]
    assert sorted(k.name for k in checks.check_keys) == [
        "realized_mae",
        "realized_r2",
        "realized_rmse",
    ]
    # rmse is an error: 0.25 realized against 0.10 on the holdout is 0.15 worse
    worse = realized_check(t, "rmse", 0.25, 0.10, None)  # type: ignore[arg-type]
    assert not worse.passed and worse.description == (
        "realized rmse 0.2500 is 0.1500 worse than the training holdout rmse 0.1000 (tolerance 0.1)"
    )
    assert realized_check(t, "r2", 0.85, 0.9, None).passed  # type: ignore[arg-type]
    # a report that says regression for a model that declares no task is named
    undeclared = dataclasses.replace(demo.listing_scores)
    with pytest.raises(MonitoringError) as exc:
        monitored_task(undeclared, {"task": "regression"})
    assert "declare Model(task='regression')" in str(exc.value)
    assert monitored_task(t, {"task": "regression"}) is Task.REGRESSION  # type: ignore[arg-type]


def test_task_and_tolerances_are_validated_at_load() -> None:
    with pytest.raises(ModelSpecError) as exc:
        dataclasses.replace(demo.listing_ctr_model, task="ranking")
    assert str(exc.value) == (
        "Model 'listing_ctr_model': task='ranking' is invalid; expected one of "
        "'classification', 'regression'."
    )
    with pytest.raises(ModelSpecError) as exc:
        dataclasses.replace(demo.listing_scores, realized_tolerances={"rsme": 0.1})
    assert "realized_tolerances names 'rsme'; expected one of auc, logloss" in str(exc.value)
