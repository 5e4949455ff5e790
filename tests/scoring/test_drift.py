"""Drift before labels: a scored day's PSI per feature against the model partition's
training window and of its scores against the holdout predictions, measured by the real
scoring job (the local launcher running the archive's trainer.score) from the histograms
in the trainer's real report, recorded as the day's metadata and judged by its checks."""

from __future__ import annotations

from typing import Any

import dagster as dg
import numpy as np
import pytest
from zipline_runtime import stats

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, write_partition
from tests.support.scoring import D1, D2, D3, scoring_defs, write_days
from tests.support.training import TABLE, make_model
from zipline_dagster import EventSource, ModelSpecError, ModelTransforms
from zipline_dagster.lineage.partitions import table_asset_key
from zipline_dagster.scoring.drift import FEATURES_CHECK, PREDICTIONS_CHECK, judge_day


@pytest.mark.slow
def test_a_shifted_day_drifts_and_a_like_day_does_not(file_base: str) -> None:
    write_days(file_base, days_ending(D2, 5))
    shifted = ctr_rows(D3, 300)
    shifted["price_log"] += 2.0  # prices jumped: the model has never seen such rows
    write_partition(file_base, TABLE, D3, shifted)
    _, model, t, defs = scoring_defs(TRAINERS / "listing_ctr_model", file_base, None)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()

    def run(key: dg.AssetKey, ds: str) -> Any:
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )
        assert result.success
        return result

    for ds in (D1, D2):
        run(dg.AssetKey(["models", model.name]), ds)
    scores = table_asset_key(t.table)

    def scored(ds: str) -> tuple[dict[str, Any], dict[str, Any]]:
        # the scores asset's run takes its checks along (they target it)
        result = job.execute_in_process(
            instance=instance, asset_selection=[scores], partition_key=ds
        )
        (event,) = result.get_asset_materialization_events()
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        md = {k: v.value for k, v in mat.metadata.items()}
        return md, {c.check_name: c for c in result.get_asset_check_evaluations()}

    like, like_checks = scored(D2)  # a day like the training window
    assert set(k for k in like if k.startswith("drift/psi/")) == {
        "drift/psi/price_log",
        "drift/psi/inventory_count",
    }
    assert like["drift/max_feature_psi"] < 0.1 and like["drift/psi_predictions"] < 0.1
    assert like_checks[FEATURES_CHECK].passed and like_checks[PREDICTIONS_CHECK].passed
    assert like_checks[FEATURES_CHECK].description.startswith("stable (PSI < 0.1)")

    drifted, checks = scored(D3)
    assert drifted["drift/psi/price_log"] > 0.25  # prices moved two units
    assert drifted["drift/psi/inventory_count"] < 0.1  # stock did not
    assert drifted["drift/top_features"].startswith("price_log ")
    assert drifted["drift/psi_predictions"] > 0.25  # and the scores followed them
    feature = checks[FEATURES_CHECK]
    assert not feature.passed and feature.severity == dg.AssetCheckSeverity.ERROR
    assert feature.description.startswith("drifted (PSI >= 0.25): price_log PSI ")
    assert not checks[PREDICTIONS_CHECK].passed


def test_psi_against_a_reference_histogram() -> None:
    rng = np.random.default_rng(0)
    reference = stats.histogram(rng.normal(0, 1, 20_000))
    assert reference is not None and len(reference["fractions"]) == 10
    assert stats.psi(reference, rng.normal(0, 1, 5_000)) < 0.01
    assert 0.1 < stats.psi(reference, rng.normal(0.4, 1, 5_000)) < 0.25  # a moderate shift
    assert stats.psi(reference, rng.normal(2, 1, 5_000)) > 1.0
    assert stats.psi(None, [1.0]) is None and stats.psi(reference, [np.nan]) is None
    # a constant feature: one edge, two bins; the same constant does not drift
    constant = stats.histogram(np.full(100, 3.0))
    assert stats.psi(constant, np.full(50, 3.0)) == 0.0


def test_a_partition_trained_before_drift_was_measured_says_so() -> None:
    t = ModelTransforms(
        sources=[EventSource(table=TABLE)],
        models=[make_model("0123456789ab", "file:///tmp/x")],
        passthrough_fields=["listing_id"],
        output_namespace="ctr",
    )
    (_, features), (_, predictions) = judge_day(t, {"rows": 10}, D2)
    assert features.passed and predictions.passed
    assert "carries no drift reference" in str(features.description)
    (_, missing), _ = judge_day(t, {}, D2)
    assert missing.description == f"{D2} is not scored yet"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drift_warn": 0}, "drift_warn=0 is invalid; expected a population stability index > 0"),
        ({"drift_fail": -1}, "drift_fail=-1 is invalid"),
        ({"drift_warn": 0.3, "drift_fail": 0.2}, "drift_warn=0.3 is above drift_fail=0.2"),
    ],
)
def test_drift_thresholds_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ModelSpecError) as err:
        ModelTransforms(
            sources=[EventSource(table=TABLE)],
            models=[make_model("0123456789ab", "file:///tmp/x")],
            passthrough_fields=["listing_id"],
            output_namespace="ctr",
            **kwargs,
        )
    assert message in str(err.value)
