"""What a model predicts (its task), and the metrics each task is judged by.

A ``Model`` declares its task (``Model(task="regression")``) or leaves it to its
trainer's report (``"task"`` in ``metrics.json``; classification when neither says).
Monitoring computes the realized metrics of the task: the same keys the trainer reports
for its holdout, so each realized metric is compared with the holdout value of the same
metric.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class Task(enum.StrEnum):
    """A model's task; each has its realized metrics (``REALIZED_METRICS``)."""

    CLASSIFICATION = "classification"
    REGRESSION = "regression"


#: The realized metrics monitoring computes per task, each the key of the trainer's
#: holdout metric it is compared with (``holdout_auc`` ...).
REALIZED_METRICS: Mapping[Task, tuple[str, ...]] = {
    Task.CLASSIFICATION: ("auc", "logloss", "accuracy"),
    Task.REGRESSION: ("rmse", "mae", "r2"),
}
#: How far a realized metric may be worse than the holdout value before its check warns,
#: by metric key (absolute); a ``ModelTransforms`` may override any of them.
DEFAULT_TOLERANCES: Mapping[str, float] = {
    "auc": 0.05,
    "logloss": 0.1,
    "accuracy": 0.05,
    "rmse": 0.1,
    "mae": 0.1,
    "r2": 0.1,
}
#: The model types trainers report (``model_type``), by the task they imply.
_MODEL_TYPE_PREFIXES = {"binary:": Task.CLASSIFICATION, "multi:": Task.CLASSIFICATION,
                        "reg:": Task.REGRESSION}  # fmt: skip


def task_of(declared: Task | str | None, report: Mapping[str, Any] | None) -> Task:
    """The task a model partition was trained for: the declared one, else the report's
    ``task`` (or what its ``model_type`` implies), else classification."""
    if declared is not None:
        return Task(declared)
    report = report or {}
    said = report.get("task")
    if isinstance(said, str) and said in Task.__members__.values():
        return Task(said)
    model_type = str(report.get("model_type") or "")
    for prefix, task in _MODEL_TYPE_PREFIXES.items():
        if prefix in model_type:
            return task
    return Task.CLASSIFICATION
