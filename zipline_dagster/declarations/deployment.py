"""Zipline's deployment declarations: when a trained model partition is good enough.

``Model(..., deployment_conf=DeploymentSpec(rollout_strategy=RolloutStrategy(
rollout_metric_thresholds=[Metric("holdout_auc", 0.65)])))``. Plain Python, validated
when constructed: a metric name must be one the trainer's report holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from zipline_dagster.declarations.errors import ModelSpecError

#: Report metrics a threshold may name: ``{split}_{metric}`` for the train and holdout
#: splits; ``True`` where higher is better (the threshold is a minimum), ``False`` for
#: losses (a maximum).
HIGHER_IS_BETTER = {"auc": True, "accuracy": True, "logloss": False, "rows": True}
SPLITS = ("train", "holdout")
KNOWN_METRICS: dict[str, bool] = {
    f"{split}_{metric}": better for split in SPLITS for metric, better in HIGHER_IS_BETTER.items()
}


def higher_is_better(name: str) -> bool:
    return KNOWN_METRICS[name]


@dataclass(frozen=True)
class Metric:
    """A rollout threshold on a report metric.

    Args:
        name: a metric of the trainer's report, ``{split}_{metric}`` (``holdout_auc``,
            ``holdout_logloss`` ...).
        threshold: a minimum for scores (AUC, accuracy, rows), a maximum for losses.

    Example:
        ``Metric(name="holdout_auc", threshold=0.65)``
    """

    name: str
    threshold: float

    def __post_init__(self) -> None:
        if self.name not in KNOWN_METRICS:
            raise ModelSpecError(
                f"Metric name={self.name!r} is unknown; the report holds: "
                + ", ".join(sorted(KNOWN_METRICS))
            )
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, (int, float))
            or not math.isfinite(self.threshold)
        ):
            raise ModelSpecError(
                f"Metric {self.name!r}: threshold={self.threshold!r} is invalid; expected a "
                "finite number (a minimum for scores, a maximum for losses)"
            )

    @property
    def is_minimum(self) -> bool:
        return higher_is_better(self.name)

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.is_minimum else value <= self.threshold

    def describe(self) -> str:
        return f"{self.name} {'>=' if self.is_minimum else '<='} {self.threshold:g}"


@dataclass(frozen=True)
class RolloutStrategy:
    """Which partitions may become the champion.

    Args:
        rollout_metric_thresholds: every one must hold: they are the partition's blocking
            ``rollout_thresholds`` check.
        regression_tolerance: how much worse than the current champion each threshold
            metric of a newer partition may be (absolute; 0 = not worse at all). The
            champion passes over one that is worse; it is never a partition's gate.

    Example:
        ``RolloutStrategy(rollout_metric_thresholds=[Metric("holdout_auc", 0.65)],
        regression_tolerance=0.02)``
    """

    rollout_metric_thresholds: Sequence[Metric] = field(default_factory=tuple)
    regression_tolerance: float = 0.0

    def __post_init__(self) -> None:
        for m in self.rollout_metric_thresholds:
            if not isinstance(m, Metric):
                raise ModelSpecError(
                    f"RolloutStrategy: rollout_metric_thresholds holds {type(m).__name__}; "
                    "expected Metric(name, threshold)"
                )
        names = [m.name for m in self.rollout_metric_thresholds]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ModelSpecError(
                f"RolloutStrategy: rollout_metric_thresholds names {', '.join(dupes)} twice"
            )
        tol = self.regression_tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ModelSpecError(
                f"RolloutStrategy: regression_tolerance={tol!r} is invalid; expected a number >= 0"
            )
        object.__setattr__(self, "rollout_metric_thresholds", tuple(self.rollout_metric_thresholds))


@dataclass(frozen=True)
class DeploymentSpec:
    """How a model's trained partitions are judged before one serves.

    Args:
        rollout_strategy: the thresholds and the regression tolerance
            (``RolloutStrategy``).

    Example:
        ``DeploymentSpec(rollout_strategy=RolloutStrategy([Metric("holdout_auc", 0.65)]))``
    """

    rollout_strategy: RolloutStrategy = field(default_factory=RolloutStrategy)
