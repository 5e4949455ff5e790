"""The trainer support's numbers (``zipline_runtime.stats``, in the runtime; the
platform's monitoring realizes the same metrics with it): sklearn's metrics in numpy, so
a trainer process never imports scikit-learn, and xgboost imported without it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn import metrics
from zipline_runtime import stats


def cases() -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 2_000)
    noisy = np.clip(0.3 * y + rng.random(2_000) * 0.7, 0, 1)
    return [
        # xgboost's predictions are float32
        ("float32 scores", y, noisy.astype(np.float32)),
        # ties across both classes: AUC counts each tied pair a half
        ("tied scores", y, np.round(noisy, 1)),
        # probabilities of exactly 0 and 1: the log loss clips them, never inf or nan
        ("certain scores", np.array([0, 1, 1, 0, 1]), np.array([0.0, 1.0, 1.0, 1.0, 0.4])),
        ("float64 scores", np.array([0, 1, 0, 1, 1, 0, 0]), noisy[:7]),
    ]


@pytest.mark.parametrize(("name", "y", "p"), cases(), ids=[c[0] for c in cases()])
def test_the_metrics_are_sklearns(name: str, y: np.ndarray, p: np.ndarray) -> None:
    assert stats.roc_auc(y, p) == pytest.approx(metrics.roc_auc_score(y, p), rel=1e-12)
    assert stats.log_loss(y, p) == pytest.approx(metrics.log_loss(y, p, labels=[0, 1]), rel=1e-6)
    assert stats.accuracy(y, p) == metrics.accuracy_score(y, (p >= 0.5).astype(int))
    ours = stats.precision_recall_curve(y, p)
    theirs = metrics.precision_recall_curve(y, p)
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_regression_metrics_are_sklearns() -> None:
    rng = np.random.default_rng(3)
    y = rng.normal(3.0, 1.0, 2_000)
    for p in (y + rng.normal(0, 0.5, 2_000), np.full(2_000, 3.0), (y * 0.9).astype(np.float32)):
        assert stats.rmse(y, p) == pytest.approx(metrics.root_mean_squared_error(y, p), abs=1e-12)
        assert stats.mae(y, p) == pytest.approx(metrics.mean_absolute_error(y, p), abs=1e-12)
        assert stats.r2(y, p) == pytest.approx(metrics.r2_score(y, p), abs=1e-12)


def test_metrics_undefined_for_the_labels_say_so() -> None:
    with pytest.raises(ValueError, match="roc_auc: the labels hold one class"):
        stats.roc_auc(np.ones(4), np.linspace(0, 1, 4))
    with pytest.raises(ValueError, match="precision_recall_curve: the labels hold no positive"):
        stats.precision_recall_curve(np.zeros(4), np.linspace(0, 1, 4))
    with pytest.raises(ValueError, match="r2: every label is the same"):
        stats.r2(np.full(4, 2.0), np.linspace(0, 1, 4))


def test_xgboost_is_imported_without_scikit_learn() -> None:
    """A trainer's process imports xgboost without the scikit-learn API it would pull in
    (over a CPU-second each); scikit-learn itself still imports afterwards."""
    code = (
        "import sys\n"
        "from zipline_runtime.stats import import_xgboost\n"
        "xgb = import_xgboost()\n"
        "assert 'sklearn' not in sys.modules, 'imported'\n"
        "import sklearn.base\n"
        "print(xgb.__version__, sklearn.base.BaseEstimator.__name__, xgb is import_xgboost())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["3.2.0", "BaseEstimator", "True"]
