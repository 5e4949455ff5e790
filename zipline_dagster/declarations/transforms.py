"""Zipline's ``ModelTransforms``: enrich a source table with a model's outputs, as a new
daily table.

``ModelTransforms(sources=[EventSource(table="ctr.training_v1")],
models=[listing_ctr_model], passthrough_fields=["listing_id", "ts"],
output_namespace="ctr")`` declares ``ctr.listing_ctr_model_scores``: partition ``ds``
holds one row per source row of day ``ds`` with the passthrough fields, ``score``,
``model_version``, ``model_ds`` and ``model_age_days``. Which model partition scores a
day is ``score_with`` (``ScoreWith``): by default the newest partition at or before
``ds-1`` (trained only on data up to the day before, so nothing leaks) whose blocking
gates pass.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zipline_dagster.declarations.errors import ModelSpecError
from zipline_dagster.declarations.model import EventSource, Model
from zipline_dagster.declarations.tasks import DEFAULT_TOLERANCES

_NAME_RE = re.compile(r"^[a-z0-9_]+$")
_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Columns the scores table always has; a passthrough field may not take their names.
OUTPUT_COLUMNS = ("score", "model_version", "model_ds", "model_age_days")
#: The inference entrypoint in the model's trainer archive.
DEFAULT_INFERENCE_MODULE = "trainer.score"


def _checked_fields(who: str, fields: list[str]) -> list[str]:
    """Passthrough fields: plain column names, none twice, none the scores table's own."""
    for f in fields:
        if not isinstance(f, str) or not _COLUMN_RE.match(f):
            raise ModelSpecError(
                f"{who}: passthrough_fields holds {f!r}; expected plain column names"
            )
        if f in OUTPUT_COLUMNS or f == "ds":
            raise ModelSpecError(
                f"{who}: passthrough field {f!r} collides with a column the scores table "
                f"always has ({', '.join((*OUTPUT_COLUMNS, 'ds'))})"
            )
    if len(set(fields)) != len(fields):
        raise ModelSpecError(f"{who}: passthrough_fields repeats a column: {fields}")
    return fields


def _is_tolerance(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0


def _check_tolerances(who: str, auc: object, tolerances: dict[str, object]) -> None:
    if not _is_tolerance(auc):
        raise ModelSpecError(
            f"{who}: realized_auc_tolerance={auc!r} is invalid; expected a number >= 0"
        )
    for metric, value in tolerances.items():
        if metric not in DEFAULT_TOLERANCES:
            raise ModelSpecError(
                f"{who}: realized_tolerances names {metric!r}; expected one of "
                + ", ".join(DEFAULT_TOLERANCES)
            )
        if not _is_tolerance(value):
            raise ModelSpecError(
                f"{who}: realized_tolerances[{metric!r}]={value!r} is invalid; expected a "
                "number >= 0"
            )


def _check_drift(who: str, warn: object, fail: object) -> None:
    for name, value in (("drift_warn", warn), ("drift_fail", fail)):
        if not _is_tolerance(value) or value == 0:
            raise ModelSpecError(
                f"{who}: {name}={value!r} is invalid; expected a population stability index > 0 "
                "(0.1 and 0.25 by default)"
            )
    if warn > fail:  # type: ignore[operator]
        raise ModelSpecError(
            f"{who}: drift_warn={warn!r} is above drift_fail={fail!r}; expected "
            "drift_warn <= drift_fail"
        )


class ScoreWith(enum.StrEnum):
    """Which model partition scores day ``ds`` of a ``ModelTransforms``.

    * ``NEWEST_PASSING`` (default): the newest partition at or before ``ds-1`` whose
      blocking gates pass (``ds-1`` itself must be trained: it is the day's lineage). When
      none passes, the day fails naming the gates that failed.
    * ``CHAMPION``: the model's champion pointer.
    * ``DAY_BEFORE``: partition ``ds-1`` whatever its gates said, for evaluation; the
      day's metadata says so.
    """

    NEWEST_PASSING = "newest_passing"
    CHAMPION = "champion"
    DAY_BEFORE = "day_before"


@dataclass(frozen=True)
class ModelTransforms:
    """A daily scores table: each row of the source's day ``ds`` scored by one model
    partition, as a Ray Job from the model's trainer archive (its ``inference_module``).

    Args:
        sources: exactly one ``EventSource``, the table whose rows are scored.
        models: exactly one ``Model``.
        passthrough_fields: source columns copied into each scores row.
        output_namespace: the scores table's namespace.
        name: the table's name in the namespace; default ``{model name}_scores``.
        score_with: which model partition scores a day (``ScoreWith``, or its value).
        inference_module: the archive's inference entrypoint.
        labels, label_column, label_keys: monitoring: the table whose partition ``ds``
            holds day ``ds``'s labels (none: no monitoring asset), its label column, and
            the columns joining a label to a score (default the passthrough fields).
        realized_tolerances: by realized metric (``auc``, ``logloss``, ``accuracy``,
            ``rmse``, ``mae``, ``r2``), how much worse than the holdout value of the same
            metric it may be before its monitoring check warns (absolute); the others
            keep ``tasks.DEFAULT_TOLERANCES``.
        realized_auc_tolerance: the AUC's, unless ``realized_tolerances`` names it.
        drift_warn, drift_fail: the population stability index (PSI) of a scored day
            against the model partition's training window (per feature) and holdout
            predictions at which its drift checks warn, and fail (both warnings: they
            never block); 0 < drift_warn <= drift_fail.
        batch_rows: rows a scoring job scores at once and writes per file (a whole
            number >= 0; 0: the runtime's default). It shapes the files, not the scores,
            so it is not part of the table's code version.

    Example:
        ``ModelTransforms(sources=[EventSource(table="ctr.training_v1")],
        models=[listing_ctr_model], passthrough_fields=["view_id"], output_namespace="ctr",
        labels=EventSource(table="ctr.labels_v1"), label_keys=["view_id"])``
    """

    sources: Sequence[EventSource]
    models: Sequence[Model]
    passthrough_fields: Sequence[str] = field(default_factory=tuple)
    output_namespace: str = ""
    #: The table's name inside the namespace; default ``{model name}_scores``.
    name: str | None = None
    score_with: ScoreWith | str = ScoreWith.NEWEST_PASSING
    inference_module: str = DEFAULT_INFERENCE_MODULE
    #: Monitoring: the table whose partition ``ds`` holds the labels of day ``ds``
    #: (none: no monitoring asset), its label column, and the columns that join a
    #: label to a score (default: the passthrough fields).
    labels: EventSource | None = None
    label_column: str = "label"
    label_keys: Sequence[str] = field(default_factory=tuple)
    #: The monitoring check warns when the realized AUC is this much below the
    #: training-time holdout AUC (or below the model's holdout_auc threshold).
    realized_auc_tolerance: float = 0.05
    realized_tolerances: Mapping[str, float] = field(default_factory=dict)
    #: A scored day's PSI at which its drift checks warn, and fail.
    drift_warn: float = 0.1
    drift_fail: float = 0.25
    batch_rows: int = 0

    def __post_init__(self) -> None:
        sources, models = list(self.sources), list(self.models)
        if len(sources) != 1 or not isinstance(sources[0], EventSource):
            raise ModelSpecError(
                f"ModelTransforms: sources={sources!r} is invalid; expected exactly one "
                "EventSource (one source table per scores table)"
            )
        if len(models) != 1 or not isinstance(models[0], Model):
            raise ModelSpecError(
                f"ModelTransforms: models holds {len(models)} item(s); expected exactly one Model"
            )
        who = f"ModelTransforms of {models[0].name!r}"
        self._check_names(who)
        fields = _checked_fields(who, list(self.passthrough_fields))
        keys = list(self.label_keys) or fields
        if self.labels is not None:
            self._check_labels(who, keys, fields)
        try:
            object.__setattr__(self, "score_with", ScoreWith(self.score_with))
        except ValueError:
            raise ModelSpecError(
                f"{who}: score_with={self.score_with!r} is invalid; expected one of "
                + ", ".join(repr(w.value) for w in ScoreWith)
            ) from None
        if models[0].rollout.shadow and self.score_with is not ScoreWith.CHAMPION:
            raise ModelSpecError(
                f"{who}: score_with={str(self.score_with)!r}, but {models[0].name}'s rollout "
                "is kind='shadow': a challenger must not serve before its shadow days, and "
                "only the champion is sure not to be it; declare score_with='champion'"
            )
        _check_tolerances(who, self.realized_auc_tolerance, dict(self.realized_tolerances))
        _check_drift(who, self.drift_warn, self.drift_fail)
        _check_batch_rows(who, self.batch_rows)
        object.__setattr__(self, "label_keys", tuple(keys))
        object.__setattr__(self, "sources", tuple(sources))
        object.__setattr__(self, "models", tuple(models))
        object.__setattr__(self, "passthrough_fields", tuple(fields))

    def _check_names(self, who: str) -> None:
        """The output namespace and name, and the inference module."""
        if not isinstance(self.output_namespace, str) or not _NAME_RE.match(self.output_namespace):
            raise ModelSpecError(
                f"{who}: output_namespace={self.output_namespace!r} is invalid; expected "
                "lower-case letters, digits and underscores"
            )
        if self.name is not None and (
            not isinstance(self.name, str) or not _NAME_RE.match(self.name)
        ):
            raise ModelSpecError(
                f"{who}: name={self.name!r} is invalid; expected lower-case letters, digits "
                "and underscores"
            )
        if not isinstance(self.inference_module, str) or not re.match(
            r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", self.inference_module
        ):
            raise ModelSpecError(
                f"{who}: inference_module={self.inference_module!r} is invalid; expected a "
                "dotted module path in the trainer archive, e.g. trainer.score"
            )

    def _check_labels(self, who: str, keys: list[str], fields: list[str]) -> None:
        """Monitoring's labels table, label column and join keys."""
        if not isinstance(self.labels, EventSource):
            raise ModelSpecError(
                f"{who}: labels={self.labels!r} is invalid; expected an EventSource"
            )
        if not keys:
            raise ModelSpecError(
                f"{who}: monitoring joins labels to scores on label_keys (default the "
                "passthrough_fields), and both are empty"
            )
        absent = [k for k in keys if k not in fields]
        if absent:
            raise ModelSpecError(
                f"{who}: label_keys {absent} are not passthrough_fields {fields}: the "
                "scores table must carry the columns it is joined on"
            )
        if not isinstance(self.label_column, str) or not _COLUMN_RE.match(self.label_column):
            raise ModelSpecError(f"{who}: label_column={self.label_column!r} is invalid")

    def tolerance(self, metric: str) -> float:
        """How much worse than the holdout value realized ``metric`` may be."""
        if metric in self.realized_tolerances:
            return float(self.realized_tolerances[metric])
        if metric == "auc":
            return float(self.realized_auc_tolerance)
        return DEFAULT_TOLERANCES[metric]

    @property
    def challenger_table(self) -> str:
        """Where a shadow challenger's scores of each day go: the table beside the scores
        (``{table}_challenger``), the same columns."""
        return f"{self.table}_challenger"

    @property
    def use_champion(self) -> bool:
        return self.score_with is ScoreWith.CHAMPION

    @property
    def model(self) -> Model:
        return self.models[0]

    @property
    def source(self) -> EventSource:
        return self.sources[0]

    @property
    def table(self) -> str:
        return f"{self.output_namespace}.{self.name or self.model.name + '_scores'}"


def _check_batch_rows(who: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelSpecError(
            f"{who}: batch_rows={value!r} is invalid; expected a whole number >= 0 "
            "(0: the runtime's default)"
        )
