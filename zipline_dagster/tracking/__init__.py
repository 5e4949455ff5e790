"""The MLflow hand-off (optional, off unless a tracking URI is configured).

Every model partition attempt becomes one MLflow run, in the experiment named after its
model: tags (asset key, partition, trainer version, attempt id, Dagster run id and a link
to it), the trainer's flags as params, the report's train and holdout metrics, the report
as an artifact and the model's files as a reference to their versioned URI (copied only
when ``copy_artifacts`` is set). A partition the champion points at becomes a version of
the registered model named after the model, and the alias ``champion`` follows our
pointer, which stays the truth: an alias moved by hand is put back, with a warning.

A partition and its attempt id identify a run (a range trains its days in one attempt):
an attempt already logged is never logged again (a retried step, a re-executed run, two
processes at once: the earliest run of an attempt stays, a later duplicate is deleted). MLflow never fails or slows training beyond
``timeout_s`` a call: a tracking server that does not answer in time or errs is warned
about, skipped for the rest of the step, and what it missed is logged on the champion's
next evaluation (``Tracker.sync``), from storage.
"""

from zipline_dagster.tracking.listener import MlflowResource, mlflow_of
from zipline_dagster.tracking.records import (
    ATTEMPT_TAG,
    CHAMPION_ALIAS,
    GATES_TAG,
    IDENTITY_TAG,
    PENDING_TAG,
    Logged,
    Partition,
    Synced,
    flag_params,
    metadata,
    partition_from_storage,
)
from zipline_dagster.tracking.tracker import Tracker

__all__ = [
    "ATTEMPT_TAG",
    "CHAMPION_ALIAS",
    "GATES_TAG",
    "IDENTITY_TAG",
    "PENDING_TAG",
    "Logged",
    "MlflowResource",
    "Partition",
    "Synced",
    "Tracker",
    "flag_params",
    "metadata",
    "mlflow_of",
    "partition_from_storage",
]
