"""Zipline's deployment declarations: when a trained model partition is good enough.

``Model(..., deployment_conf=DeploymentSpec(rollout_strategy=RolloutStrategy(
rollout_metric_thresholds=[Metric("holdout_auc", 0.65)])))``. Plain Python, validated
when constructed; a metric's name and direction are checked by the ``Model`` that
declares it (its refusal names the model), and that the trainer's report holds it when
the gate runs (a metric missing from the report fails the gate, listing what it holds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from zipline_dagster.declarations.errors import ModelSpecError

#: The report's splits; a metric is named ``{split}_{key}``, ``key`` one of the split's
#: metrics in the report (``holdout_auc``, ``holdout_rmse``) or ``rows``.
SPLITS = ("train", "holdout")
#: Metric keys whose direction is known: True where higher is better (the threshold is a
#: minimum), False for losses and errors (a maximum). Any other key declares its own.
DIRECTIONS = {
    "auc": True,
    "accuracy": True,
    "precision": True,
    "recall": True,
    "f1": True,
    "r2": True,
    "rows": True,
    "logloss": False,
    "rmse": False,
    "mae": False,
    "mse": False,
}
#: Metric keys whose values lie between 0 and 1 (a threshold outside is refused).
FRACTIONS = frozenset({"auc", "accuracy", "precision", "recall", "f1"})
_NAME_RE = re.compile(r"^(train|holdout)_([a-z0-9][a-z0-9_]*)$")


@dataclass(frozen=True)
class Metric:
    """A rollout threshold on a metric of the trainer's report.

    Args:
        name: ``{split}_{key}``: ``split`` train or holdout, ``key`` any metric the
            trainer reports for it, or ``rows`` (``holdout_auc``, ``holdout_rmse``,
            ``train_r2``). The metadata's spelling, ``holdout/auc``, is the same metric.
        threshold: a minimum where higher is better, a maximum where lower is (from 0
            to 1 for auc, accuracy, precision, recall and f1).
        higher_is_better: the direction; None takes it from the known keys (auc,
            accuracy, precision, recall, f1, r2, rows higher; logloss, rmse, mae, mse
            lower), and another key must declare it.

    Example:
        ``Metric(name="holdout_rmse", threshold=0.3)``;
        ``Metric(name="holdout_ndcg", threshold=0.4, higher_is_better=True)``
    """

    name: str
    threshold: float
    higher_is_better: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.name, str):  # the metadata's holdout/auc is holdout_auc
            object.__setattr__(self, "name", self.name.replace("/", "_", 1))
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, (int, float))
            or not math.isfinite(self.threshold)
        ):
            raise ModelSpecError(
                f"Metric {self.name!r}: threshold={self.threshold!r} is invalid; expected a "
                "finite number (a minimum where higher is better, a maximum where lower is)"
            )
        if self.higher_is_better is not None and not isinstance(self.higher_is_better, bool):
            raise ModelSpecError(
                f"Metric {self.name!r}: higher_is_better={self.higher_is_better!r} is "
                "invalid; expected True, False or None (from the known metric keys)"
            )

    @property
    def key(self) -> str:
        """The report's key within the split (``auc`` of ``holdout_auc``)."""
        return self.name.partition("_")[2]

    def problem(self) -> str | None:
        """Why this metric cannot be judged (its name, or no known direction); None when
        it can. The ``Model`` declaring it raises it, naming the model."""
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            return (
                f"Metric name={self.name!r} is invalid; expected {{split}}_{{metric}} with "
                "split train or holdout and a metric the trainer reports (holdout_auc, "
                "holdout_rmse, train_r2 ...; holdout/auc is accepted too)"
            )
        if self.key in FRACTIONS and not 0 <= self.threshold <= 1:
            return (
                f"Metric {self.name!r}: threshold={self.threshold!r} is invalid; "
                f"{self.key} lies between 0 and 1, so expected a threshold from 0 to 1"
            )
        if self.higher_is_better is None and self.key not in DIRECTIONS:
            return (
                f"Metric {self.name!r}: whether higher is better is not known for "
                f"{self.key!r} (known: {', '.join(sorted(DIRECTIONS))}); declare "
                "higher_is_better=True or False"
            )
        return None

    @property
    def is_minimum(self) -> bool:
        if self.higher_is_better is not None:
            return self.higher_is_better
        return DIRECTIONS[self.key]

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.is_minimum else value <= self.threshold

    def describe(self) -> str:
        return f"{self.name} {'>=' if self.is_minimum else '<='} {self.threshold:g}"


#: ``RolloutStrategy.kind``'s values
ROLLOUT_KINDS = ("immediate", "shadow")


@dataclass(frozen=True)
class RolloutStrategy:
    """Which partitions may become the champion.

    Args:
        rollout_metric_thresholds: every one must hold: they are the partition's blocking
            ``rollout_thresholds`` check.
        regression_tolerance: how much worse than the current champion each threshold
            metric of a newer partition may be (absolute; 0 = not worse at all). The
            champion passes over one that is worse; it is never a partition's gate.
        rollback_after_days: when set (K), the champion moves back to the champion it
            replaced once its realized value of a threshold metric (monitoring, on the
            days it scored) is worse than its holdout value by more than
            ``regression_tolerance`` on its K latest monitored days running; the partition
            rolled back from is retired (never advanced to again). Off (None) by default.
        kind: ``"immediate"`` (default): a newer partition passing its gates becomes the
            champion. ``"shadow"``: a passing partition of a new trainer version becomes
            the challenger instead; each scored day is scored by both (the challenger into
            the table beside the scores, ``{scores table}_challenger``) and monitored for
            both, and after ``days`` monitored days on which its realized threshold metrics
            are not worse than the champion's beyond ``regression_tolerance`` the champion
            moves to it; one worse on any of them is retired, naming the days. Newer
            partitions of the champion's own version still advance it immediately. Scores
            tables of the model must score with the champion (``score_with="champion"``).
        days: ``"shadow"``: the monitored days the challenger is judged on (N).

    Example:
        ``RolloutStrategy(rollout_metric_thresholds=[Metric("holdout_auc", 0.65)],
        regression_tolerance=0.02)``
    """

    rollout_metric_thresholds: Sequence[Metric] = field(default_factory=tuple)
    regression_tolerance: float = 0.0
    rollback_after_days: int | None = None
    kind: str = "immediate"
    days: int | None = None

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
        self._check_rollback()
        self._check_shadow()

    def _check_shadow(self) -> None:
        kind, n = self.kind, self.days
        if kind not in ROLLOUT_KINDS:
            raise ModelSpecError(
                f"RolloutStrategy: kind={kind!r} is invalid; expected one of "
                + ", ".join(repr(k) for k in ROLLOUT_KINDS)
            )
        if kind == "immediate" and n is not None:
            raise ModelSpecError(
                f"RolloutStrategy: days={n!r} is the shadow rollout's; it means nothing with "
                "kind='immediate' (declare kind='shadow', or leave days out)"
            )
        if kind != "shadow":
            return
        if n is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelSpecError(
                f"RolloutStrategy: days={n!r} is invalid; kind='shadow' needs the number of "
                "monitored days the challenger is judged on, a whole number >= 1"
            )
        if not self.rollout_metric_thresholds:
            raise ModelSpecError(
                "RolloutStrategy: kind='shadow' compares the challenger's realized threshold "
                "metrics with the champion's, but rollout_metric_thresholds is empty; declare "
                "at least one Metric"
            )

    @property
    def shadow(self) -> bool:
        """A new trainer version shadows the champion before it serves."""
        return self.kind == "shadow"

    def _check_rollback(self) -> None:
        k = self.rollback_after_days
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ModelSpecError(
                f"RolloutStrategy: rollback_after_days={k!r} is invalid; expected None (off) "
                "or a whole number of days >= 1"
            )
        if k is not None and not self.rollout_metric_thresholds:
            raise ModelSpecError(
                f"RolloutStrategy: rollback_after_days={k} compares the champion's realized "
                "threshold metrics with its holdout values, but rollout_metric_thresholds is "
                "empty; declare at least one Metric"
            )

    def threshold(self, name: str) -> Metric | None:
        """The declared threshold on metric ``name`` (``holdout_auc``), if any."""
        return next((m for m in self.rollout_metric_thresholds if m.name == name), None)


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
