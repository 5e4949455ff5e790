"""Rollout declarations and gates, judged from real partitions on storage (file:// here;
the storage layer itself is tested on every scheme in tests/storage)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster import DeploymentSpec, Metric, ModelSpecError, RolloutStrategy
from zipline_dagster.declarations.model import Model
from zipline_dagster.rollout import by_hand
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import gates as g
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.artifacts import (
    attempt_dir,
    promote_attempt,
)
from zipline_dagster.storage.blobs import BlobStore, blob_store
from zipline_dagster.storage.champion_pointer import ChampionPointer
from zipline_dagster.storage.paths import model_dir_uri


def model_with(base: str, *thresholds: Metric, tolerance: float = 0.0) -> Model:
    return dataclasses.replace(
        demo.listing_ctr_model,
        model_artifact_base_uri=base,
        deployment_conf=DeploymentSpec(
            rollout_strategy=RolloutStrategy(
                rollout_metric_thresholds=list(thresholds), regression_tolerance=tolerance
            )
        ),
    )


def report(auc: float | None, logloss: float = 0.5, rows: int = 400) -> dict[str, Any]:
    status = {"holdout.auc": "the holdout set has one class (all 0)"} if auc is None else {}
    return {
        "train": {"rows": 1200, "metrics": {"auc": 0.8, "logloss": 0.4, "accuracy": 0.8}},
        "holdout": {"rows": rows, "metrics": {"auc": auc, "logloss": logloss, "accuracy": 0.7}},
        "status": status,
    }


def trained(store: BlobStore, model: Model, ds: str, rep: dict[str, Any]) -> str:
    """A finished partition, promoted by the platform's own promotion."""
    d = model_dir_uri(model.model_artifact_base_uri, model.name, model.version, ds)
    store.write_bytes(f"{attempt_dir(d, 'a1')}/metrics.json", json.dumps(rep).encode())
    store.write_bytes(f"{attempt_dir(d, 'a1')}/model.json", b"{}")
    promote_attempt(store, d, "a1", extra={})
    return d


@pytest.mark.parametrize(
    ("metric", "said"),
    [
        (
            Metric("holdout_ndcg", 0.5),
            "Model 'listing_ctr_model': deployment_conf: Metric 'holdout_ndcg': whether higher "
            "is better is not known for 'ndcg' (known: accuracy, auc, f1, logloss, mae, mse, "
            "precision, r2, recall, rmse, rows); declare higher_is_better=True or False.",
        ),
        (
            Metric("valid_auc", 0.5),
            "Model 'listing_ctr_model': deployment_conf: Metric name='valid_auc' is invalid; "
            "expected {split}_{metric} with split train or holdout",
        ),
        (  # a gate no partition can pass (`new-model --threshold 1.5`)
            Metric("holdout_auc", 1.5),
            "Model 'listing_ctr_model': deployment_conf: Metric 'holdout_auc': threshold=1.5 "
            "is invalid; auc lies between 0 and 1, so expected a threshold from 0 to 1.",
        ),
    ],
)
def test_a_metric_that_cannot_be_judged_is_refused_naming_the_model(
    metric: Metric, said: str
) -> None:
    with pytest.raises(ModelSpecError) as exc:
        model_with("file:///tmp/x", metric)
    assert str(exc.value).startswith(said)


def test_any_reported_metric_can_gate_in_either_direction() -> None:
    """Known keys take their direction; another declares it; the metadata's spelling
    (``holdout/auc``) names the same metric."""
    assert Metric("holdout/auc", 0.6) == Metric("holdout_auc", 0.6)
    assert Metric("holdout_f1", 0.5).describe() == "holdout_f1 >= 0.5"
    assert Metric("holdout_mae", 0.2).describe() == "holdout_mae <= 0.2"
    ndcg = Metric("holdout_ndcg", 0.4, higher_is_better=True)
    assert model_with("file:///tmp/x", ndcg).rollout.rollout_metric_thresholds == (ndcg,)
    assert Metric("holdout_latency", 9.0, higher_is_better=False).describe() == (
        "holdout_latency <= 9"
    )


def regression_report(rmse: float, r2: float) -> dict[str, Any]:
    """What a regression trainer reports: RMSE, MAE and R² per split, no AUC."""
    return {
        "train": {"rows": 1200, "metrics": {"rmse": 0.2, "mae": 0.15, "r2": 0.8}},
        "holdout": {"rows": 400, "metrics": {"rmse": rmse, "mae": 0.2, "r2": r2}},
        "status": {},
    }


def test_a_regression_model_is_gated_on_rmse_and_r2(file_base: str) -> None:
    model = model_with(file_base, Metric("holdout_rmse", 0.3), Metric("holdout_r2", 0.5))
    store = blob_store(file_base)
    trained(store, model, "2026-07-10", regression_report(rmse=0.25, r2=0.62))
    trained(store, model, "2026-07-11", regression_report(rmse=0.41, r2=0.31))
    ok = g.evaluate(model, store, "2026-07-10")
    assert all(r.passed for r in ok.values()), ok
    assert ok[g.THRESHOLDS].summary == (
        "holdout_rmse=0.2500 (holdout_rmse <= 0.3), holdout_r2=0.6200 (holdout_r2 >= 0.5)"
    )
    bad = g.evaluate(model, store, "2026-07-11")[g.THRESHOLDS]
    assert not bad.passed and bad.summary == (
        "holdout_rmse=0.4100 fails holdout_rmse <= 0.3; holdout_r2=0.3100 fails holdout_r2 >= 0.5"
    )
    # the champion takes the newest partition passing its gates, not the newer failing one
    assert ch.advance(store, model, by="test").pointer.ds == "2026-07-10"  # type: ignore[index]

    # A metric the report does not hold fails the gate, listing what it holds.
    auc_gated = model_with(file_base, Metric("holdout_auc", 0.6))
    missing = g.evaluate(auc_gated, store, "2026-07-10")[g.THRESHOLDS]
    assert not missing.passed and missing.summary == (
        "holdout_auc is not in the report (it holds holdout_mae, holdout_r2, holdout_rmse, "
        "holdout_rows, train_mae, train_r2, train_rmse, train_rows)"
    )


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Metric("holdout_auc", "0.6"), "threshold='0.6'"),
        (lambda: Metric("holdout_auc", float("nan")), "threshold=nan"),
        (
            lambda: RolloutStrategy([Metric("holdout_auc", 0.6), Metric("holdout_auc", 0.7)]),
            "names holdout_auc twice",
        ),
        (lambda: RolloutStrategy(regression_tolerance=-0.1), "regression_tolerance=-0.1"),
        (lambda: RolloutStrategy(["holdout_auc"]), "holds str"),
    ],
)
def test_invalid_rollout_declarations_are_named(build: Any, fragment: str) -> None:
    with pytest.raises(ModelSpecError, match=fragment):
        build()


def test_deployment_conf_must_be_a_deployment_spec() -> None:
    with pytest.raises(ModelSpecError, match="deployment_conf"):
        dataclasses.replace(demo.listing_ctr_model, deployment_conf={"holdout_auc": 0.6})


def test_thresholds_pass_and_fail_with_the_numbers(file_base: str) -> None:
    model = model_with(file_base, Metric("holdout_auc", 0.65), Metric("holdout_logloss", 0.6))
    store = blob_store(file_base)
    trained(store, model, "2026-07-10", report(0.7, logloss=0.5))
    trained(store, model, "2026-07-11", report(0.61, logloss=0.64))
    ok = g.evaluate(model, store, "2026-07-10")
    assert all(r.passed for r in ok.values()), ok
    bad = g.evaluate(model, store, "2026-07-11")[g.THRESHOLDS]
    assert not bad.passed
    assert bad.summary == (
        "holdout_auc=0.6100 fails holdout_auc >= 0.65; "
        "holdout_logloss=0.6400 fails holdout_logloss <= 0.6"
    )
    assert bad.values["holdout_auc"] == 0.61 and bad.values["holdout_auc.threshold"] == 0.65


def test_missing_metric_fails_its_threshold_with_the_reports_reason(file_base: str) -> None:
    model = model_with(file_base, Metric("holdout_auc", 0.65))
    store = blob_store(file_base)
    trained(store, model, "2026-07-10", report(None))
    results = g.evaluate(model, store, "2026-07-10")
    assert results[g.REPORT_COMPLETE].passed  # the missing metric has a status
    assert results[g.THRESHOLDS].summary == (
        "holdout_auc is missing (the holdout set has one class (all 0))"
    )


def test_report_without_a_reason_for_a_missing_metric_is_incomplete(file_base: str) -> None:
    model = model_with(file_base)
    store = blob_store(file_base)
    rep = report(0.7)
    rep["holdout"]["metrics"]["accuracy"] = None
    trained(store, model, "2026-07-10", rep)
    result = g.evaluate(model, store, "2026-07-10")[g.REPORT_COMPLETE]
    assert not result.passed
    assert result.summary == "holdout.accuracy is missing and no status says why"


def test_tampered_file_fails_the_manifest_gate(file_base: str) -> None:
    model = model_with(file_base)
    store = blob_store(file_base)
    d = trained(store, model, "2026-07-10", report(0.7))
    store.write_bytes(f"{d}/model.json", b"{'changed': 1}")
    result = g.evaluate(model, store, "2026-07-10")[g.MANIFEST_VERIFIES]
    assert not result.passed and "sha256 differs" in result.summary


def test_regression_is_the_champions_decision_never_a_partitions_gate(file_base: str) -> None:
    model = model_with(file_base, Metric("holdout_auc", 0.6), tolerance=0.02)
    store = blob_store(file_base)
    trained(store, model, "2026-07-10", report(0.75))
    trained(store, model, "2026-07-11", report(0.74))  # within the tolerance
    trained(store, model, "2026-07-12", report(0.70))  # passes 0.6, but 0.05 worse
    first = ch.advance(store, model, by="test")
    assert first.moved and first.pointer and first.pointer.ds == "2026-07-12"
    # Start again from 07-10 as champion to judge 07-11 and 07-12 against it.
    by_hand.promote(store, model, "2026-07-10", by="test")
    champion = cp.read_champion(store, model)
    # The gates judge each partition alone: the same verdict with or without a champion.
    for ds in ("2026-07-11", "2026-07-12"):
        assert all(r.passed for r in g.evaluate(model, store, ds).values())
    # The comparison the warning check shows, with the numbers.
    assert g.compare_with_champion(model, store, "2026-07-11", champion).passed
    worse = g.compare_with_champion(model, store, "2026-07-12", champion)
    assert not worse.passed
    assert worse.summary == (
        f"holdout_auc=0.7000 is 0.0500 worse than the champion {model.version}/2026-07-10 "
        "(0.7500); tolerance 0.02"
    )
    # The champion passes over the newer partition that regresses, saying why, and moves
    # to the newest one that does not.
    moved = ch.advance(store, model, by="test")
    assert moved.moved and moved.pointer and moved.pointer.ds == "2026-07-11"
    assert [r.gate for r in moved.rejected["2026-07-12"]] == [g.NO_REGRESSION]
    assert moved.rejected["2026-07-12"][0].summary == worse.summary
    assert moved.reason == "newest partition passing every gate (after 1 newer rejected)"
    # Nothing newer than 07-11 but the regressed 07-12: it stays, and says why.
    stays = ch.advance(store, model, by="test")
    assert not stays.moved
    assert stays.reason == (
        f"stays at {model.version}/2026-07-11: no newer partition passes every gate "
        "(2026-07-12 passed but regressed beyond the tolerance 0.02)"
    )


def test_no_regression_against_a_champion_without_the_metric_says_not_compared(
    file_base: str,
) -> None:
    """The gates gained holdout_logloss; the champion was judged before and never recorded
    it: the comparison is not made, and the check says so instead of passing."""
    model = model_with(file_base, Metric("holdout_auc", 0.6), Metric("holdout_logloss", 0.9))
    store = blob_store(file_base)
    trained(store, model, "2026-07-11", report(0.72, logloss=0.5))
    champion = ChampionPointer.parse(
        {"version": model.version, "ds": "2026-07-10", "metrics": {"holdout_auc": 0.7}}
    )
    result = g.compare_with_champion(model, store, "2026-07-11", champion)
    assert not result.passed and not result.compared
    assert result.summary == (
        f"not compared: the champion {model.version}/2026-07-10 has no holdout_logloss "
        "(1 other(s) not worse beyond 0)"
    )


def test_changed_gates_judge_the_champion_again(file_base: str) -> None:
    """A gate the champion fails: its next evaluation moves to the newest partition that
    passes the new gates; when none does, it keeps serving and says which gate it fails."""
    store = blob_store(file_base)
    old = model_with(file_base, Metric("holdout_auc", 0.6))
    trained(store, old, "2026-07-10", report(0.70, logloss=0.30))
    trained(store, old, "2026-07-11", report(0.75, logloss=0.60))
    assert ch.advance(store, old, by="test").pointer.ds == "2026-07-11"  # type: ignore[index]
    # under the old gates nothing changes
    assert not ch.advance(store, old, by="test").moved
    # a logloss gate the champion (0.60) fails and 07-10 (0.30) passes
    stricter = model_with(file_base, Metric("holdout_auc", 0.6), Metric("holdout_logloss", 0.5))
    moved = ch.advance(store, stricter, by="test")
    assert moved.moved and moved.pointer and moved.pointer.ds == "2026-07-10"
    assert moved.reason == (
        f"the champion {old.version}/2026-07-11 fails the current gates (holdout_logloss="
        "0.6000 fails holdout_logloss <= 0.5); newest partition passing them"
    )
    assert [r.gate for r in moved.rejected["2026-07-11"]] == [g.THRESHOLDS]
    # a gate no partition passes: the champion stays, serving, and the decision names it
    impossible = model_with(file_base, Metric("holdout_auc", 0.99))
    stays = ch.advance(store, impossible, by="test")
    assert not stays.moved and stays.pointer and stays.pointer.ds == "2026-07-10"
    assert [r.summary for r in stays.failing] == ["holdout_auc=0.7000 fails holdout_auc >= 0.99"]
    assert stays.reason.startswith(f"stays at {old.version}/2026-07-10, which fails the current")
    assert getattr(cp.read_champion(store, impossible), "ds", None) == "2026-07-10"
    # a champion forced by hand under the gates in force is left as the person chose
    forced = by_hand.promote(store, impossible, "2026-07-11", force=True, by="test")
    assert forced.forced and not ch.advance(store, impossible, by="test").moved
    assert not ch.advance(store, impossible, by="test").failing
