"""zipline_dagster: ML models as daily-partitioned Dagster assets, trained as Ray Jobs.

Importing this package never imports Ray or Spark: the code location must load without
starting either.
"""

from zipline_dagster.declarations.deployment import DeploymentSpec, Metric, RolloutStrategy
from zipline_dagster.declarations.model import (
    EventSource,
    InferenceSpec,
    Model,
    ModelBackend,
    ModelSpecError,
    Query,
    ResourceConfig,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)
from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith

__all__ = [
    "DeploymentSpec",
    "EventSource",
    "InferenceSpec",
    "Metric",
    "Model",
    "ModelBackend",
    "ModelSpecError",
    "ModelTransforms",
    "Query",
    "ResourceConfig",
    "RolloutStrategy",
    "ScoreWith",
    "TimeUnit",
    "TrainingSpec",
    "Window",
    "selects",
]
