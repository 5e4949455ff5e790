"""Trainer support, its numbers: the metrics of a split, the drift reference a trainer
reports and the drift a scoring job measures, and xgboost imported lean.

Trainers reach it through ``zipline_runtime.trainer_io`` (``tio.roc_auc``,
``tio.drift_reference`` ...), which re-exports it. Standard library
and numpy only: the metrics are sklearn's definitions (``roc_auc_score``, ``log_loss``,
``accuracy_score``, ``precision_recall_curve``, ``root_mean_squared_error``,
``mean_absolute_error``, ``r2_score``) in numpy, so a trainer process imports no
scikit-learn (about a CPU-second of imports in every job); the platform's monitoring
realizes the same metrics with them, so a holdout value and a realized one are one
definition.
"""

from __future__ import annotations

import sys
from typing import Any


def import_xgboost() -> Any:
    """xgboost, imported without scikit-learn. xgboost imports scikit-learn whenever it is
    installed, for its sklearn-style API (``XGBClassifier`` ...), which the platform's
    trainers do not use: over a CPU-second in every process that trains or scores.
    Hiding it for the import leaves that API off; scikit-learn itself still imports
    afterwards, and a process that had imported either gets xgboost as it is."""
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        import xgboost

        return xgboost
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # import sklearn -> ImportError
    try:
        import xgboost
    finally:
        del sys.modules["sklearn"]
    return xgboost


def log_loss(y: Any, p: Any) -> float:
    """Binary cross-entropy of probabilities ``p`` for labels ``y`` (0/1), ``p`` clipped
    to its dtype's epsilon as sklearn's ``log_loss`` does."""
    import numpy as np

    p = np.asarray(p)
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(float)
    eps = np.finfo(p.dtype).eps
    p = np.clip(p, eps, 1 - eps)
    positive = np.asarray(y) == 1
    return float(-np.mean(np.where(positive, np.log(p), np.log(1 - p))))


def accuracy(y: Any, p: Any, threshold: float = 0.5) -> float:
    """The share of rows whose class at ``threshold`` (``p >= threshold``) is the label."""
    import numpy as np

    return float(np.mean((np.asarray(p) >= threshold).astype(int) == np.asarray(y)))


def roc_auc(y: Any, p: Any) -> float:
    """Area under the ROC curve (Mann-Whitney, tied scores averaged); ``y`` must hold
    both classes."""
    import numpy as np

    y, p = np.asarray(y), np.asarray(p)
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p), dtype="float64")
    _, first, counts = np.unique(p[order], return_index=True, return_counts=True)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # a tie's average rank
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        raise ValueError("roc_auc: the labels hold one class; AUC is undefined")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rmse(y: Any, p: Any) -> float:
    """Root mean squared error of predictions ``p`` for labels ``y``."""
    import numpy as np

    return float(np.sqrt(np.mean((np.asarray(p) - np.asarray(y)) ** 2)))


def mae(y: Any, p: Any) -> float:
    """Mean absolute error of predictions ``p`` for labels ``y``."""
    import numpy as np

    return float(np.mean(np.abs(np.asarray(p) - np.asarray(y))))


def r2(y: Any, p: Any) -> float:
    """The coefficient of determination R² of ``p`` for ``y``; ``y`` must vary."""
    import numpy as np

    y, p = np.asarray(y, dtype=float), np.asarray(p, dtype=float)
    spread = float(np.sum((y - y.mean()) ** 2))
    if spread == 0.0:
        raise ValueError("r2: every label is the same; R² is undefined")
    return float(1.0 - np.sum((p - y) ** 2) / spread)


def precision_recall_curve(y: Any, p: Any) -> tuple[Any, Any, Any]:
    """``(precision, recall, thresholds)`` at each distinct score, as sklearn's
    ``precision_recall_curve``: thresholds increasing, recall decreasing, and a last
    point (precision 1, recall 0) without a threshold. ``y`` must hold a positive."""
    import numpy as np

    y, p = np.asarray(y), np.asarray(p)
    order = np.argsort(p, kind="mergesort")[::-1]
    p_desc, y_desc = p[order], (y[order] == 1)
    last = np.r_[np.flatnonzero(np.diff(p_desc)), len(p_desc) - 1]  # last row of each score
    tps = np.cumsum(y_desc)[last]
    fps = 1 + last - tps
    if not len(tps) or tps[-1] == 0:
        raise ValueError("precision_recall_curve: the labels hold no positive")
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    return np.r_[precision[::-1], 1.0], np.r_[recall[::-1], 0.0], p_desc[last][::-1]


#: The scores file's key-value metadata holding the day's drift (``drift_of``).
DRIFT_KEY = b"zipline.drift"
#: Bins of a drift histogram (deciles of the reference).
DRIFT_BINS = 10
#: Most values a reference histogram is built from (an even stride through them): its
#: fractions' standard error stays near 0.1%, and a month of training rows costs the
#: trainer milliseconds, not a second.
DRIFT_SAMPLE = 50_000


def histogram(values: Any) -> dict[str, list[float]] | None:
    """The decile histogram of ``values`` (``edges`` between bins, each bin's
    ``fractions``) over at most ``DRIFT_SAMPLE`` of them; None without a finite value."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if len(v) > DRIFT_SAMPLE:
        v = v[:: -(-len(v) // DRIFT_SAMPLE)]
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    edges = np.unique(np.quantile(v, np.linspace(0.0, 1.0, DRIFT_BINS + 1))[1:-1])
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
    return {"edges": edges.tolist(), "fractions": (counts / len(v)).tolist()}


def drift_reference(frame: Any, features: dict[str, str], predictions: Any) -> dict[str, Any]:
    """What a scored day's drift is measured against, for the trainer's report
    (``drift_reference``): each feature's decile histogram over the training rows
    (``features``: name -> column of ``frame``) and the holdout predictions'."""
    return {
        "features": {n: histogram(frame[c].to_numpy(dtype=float)) for n, c in features.items()},
        "predictions": histogram(predictions),
    }


def drift_reference_of(values: dict[str, Any], predictions: Any) -> dict[str, Any]:
    """``drift_reference`` of a bounded sample of the training rows (``values``: feature
    name -> its sampled values, ``stream.StridedSample``) and the holdout predictions."""
    return {
        "features": {n: histogram(v) for n, v in values.items()},
        "predictions": histogram(predictions),
    }


def psi(reference: dict[str, list[float]] | None, values: Any) -> float | None:
    """The population stability index of ``values`` against a ``reference`` histogram
    (None: no reference, or no finite value); empty bins count as 0.01% on both sides."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if reference is None or not len(v):
        return None
    edges = np.asarray(reference["edges"])
    return psi_of_counts(
        reference, np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
    )


def psi_of_counts(reference: dict[str, list[float]] | None, counts: Any) -> float | None:
    """``psi`` of values already counted into ``reference``'s bins (``counts``: one per
    bin, summed over batches); None without a reference or a counted value."""
    import numpy as np

    if reference is None or counts is None:
        return None
    actual = np.asarray(counts)
    n = int(actual.sum())
    if not n:
        return None
    a = np.clip(actual / n, 1e-4, None)
    e = np.clip(np.asarray(reference["fractions"]), 1e-4, None)
    return round(float(np.sum((a - e) * np.log(a / e))), 6)


def drift_of(
    reference: dict[str, Any] | None, frame: Any, features: dict[str, str], scores: Any
) -> dict[str, Any]:
    """A scored day's drift against its model's ``reference`` (``drift_reference``):
    ``{"features": {name: PSI}, "predictions": PSI}``; empty without a reference (a
    model trained before its report carried one)."""
    if not reference:
        return {}
    refs = reference.get("features") or {}
    return {
        "features": {
            n: value
            for n, c in features.items()
            if c in frame
            and (value := psi(refs.get(n), frame[c].to_numpy(dtype=float))) is not None
        },
        "predictions": psi(reference.get("predictions"), scores),
    }
