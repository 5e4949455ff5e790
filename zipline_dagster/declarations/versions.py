"""Code versions of declarations: each covers exactly what changes what an asset writes.

Dagster's own staleness ("unsynced" in the UI, ``code_version_changed`` in automation)
then says which partitions a change affects. What changes no output (a description, a
gate, where the artifacts live, the first partition) is left out, so it stales nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zipline_dagster.declarations.model import Model
    from zipline_dagster.declarations.transforms import ModelTransforms

#: What monitoring computes for a task (``tasks.REALIZED_METRICS``); raised when that set
#: or the way a metric is computed changes, so monitored days show unsynced.
MONITORING_METRICS_VERSION = "realized-v2"


def digest(value: Any) -> str:
    """12 hex characters of the SHA-256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def declaration_version(obj: object) -> str:
    """A code version that changes whenever the declaration (its ``repr``) changes: a
    feature producer's, every field of which shapes what it writes."""
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:12]


def model_declaration(model: Model) -> dict[str, Any]:
    """The fields of a model's declaration that change what a partition trains: the
    table, its selected columns, the window, the entrypoint, the flags, the Ray Train
    workers (data is split across them), the task and the memory budget."""
    tc = model.training_conf
    return {
        "table": model.table,
        "selects": dict(tc.training_data_source.query.selects),
        "window_days": model.window_days,
        "python_module": tc.python_module,
        "job_configs": dict(tc.job_configs),
        "workers": tc.resource_config.workers,
        "task": None if model.task is None else str(model.task),
        # the budget picks the training matrix (in memory or external); unset adds nothing,
        # so the models that set none keep their versions
        **({"memory": m} if (m := tc.resource_config.memory_per_replica) else {}),
    }


def model_declaration_hash(model: Model) -> str:
    """The hash of ``model_declaration``; the manifest of every partition records it."""
    return digest(model_declaration(model))


@dataclass(frozen=True)
class ModelCodeVersion:
    """What a model partition's output depends on besides its data: the trainer archive,
    the declaration and the job-side runtime, each by content address. Dagster holds its
    string form (``str``); nothing parses that back."""

    trainer: str
    declaration: str
    runtime: str

    def __str__(self) -> str:
        return f"{self.trainer}-{self.declaration}-{self.runtime}"


def code_version_of(model: Model) -> ModelCodeVersion:
    """A model's code version, as a record."""
    return ModelCodeVersion(model.version, model_declaration_hash(model), model.runtime)


def model_code_version(model: Model) -> str:
    """A model asset's code version, as Dagster holds it (``ModelCodeVersion``'s form)."""
    return str(code_version_of(model))


def scores_code_version(transforms: ModelTransforms) -> str:
    """A scores table's code version: the model's (what scores) and how a day is scored
    (source, passthrough fields, which partition scores it, the inference entrypoint)."""
    t = transforms
    return (
        model_code_version(t.model)
        + "-"
        + digest(
            {
                "source": t.source.table,
                "selects": dict(t.source.query.selects),
                "passthrough": list(t.passthrough_fields),
                "score_with": str(t.score_with),
                "inference_module": t.inference_module,
            }
        )
    )


def monitoring_code_version(transforms: ModelTransforms) -> str:
    """A monitoring asset's code version: its labels, how they join, the task and the
    metric set it computes (tolerances only judge, so they are left out)."""
    t = transforms
    return digest(
        {
            "labels": t.labels.table if t.labels is not None else None,
            "label_column": t.label_column,
            "label_keys": list(t.label_keys),
            "task": None if t.model.task is None else str(t.model.task),
            "metrics": MONITORING_METRICS_VERSION,
        }
    )


def gates_version(model: Model) -> str:
    """The champion's code version: the gates it judges under (thresholds, tolerance), its
    rollback policy and its shadow rollout."""
    r = model.rollout
    return digest(
        {
            "thresholds": [
                [m.name, m.threshold, m.is_minimum] for m in r.rollout_metric_thresholds
            ],
            "tolerance": r.regression_tolerance,
            # off by default: a champion declared before the policy keeps its version
            **({"rollback_after_days": r.rollback_after_days} if r.rollback_after_days else {}),
            **({"shadow_days": r.days} if r.shadow else {}),
        }
    )
