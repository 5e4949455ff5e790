"""MLflow as the platform's listener (``events``): ``MlflowResource``, and for one step
``MlflowListening``: a run per trained partition, its
gates' verdict as the run's tags, and, when the champion is evaluated, MLflow caught up
with storage (the partitions trained while it was not reachable) and the ``champion``
alias on the pointer's model version."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dagster as dg
from pydantic import Field

from zipline_dagster.declarations.model import Model
from zipline_dagster.events import (
    ChampionEvaluated,
    PartitionJudged,
    PartitionTrained,
    PlatformListener,
)
from zipline_dagster.settings import settings
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStore, blob_store
from zipline_dagster.storage.manifests import manifest_attempt
from zipline_dagster.storage.paths import model_dir_uri, model_partition_uri
from zipline_dagster.tracking.records import Partition, Synced, metadata, partition_from_storage
from zipline_dagster.tracking.tracker import Tracker


class MlflowResource(PlatformListener):
    """Where model partitions are logged in MLflow; off while ``tracking_uri`` is unset.

    Credentials are MLflow's own environment variables (``MLFLOW_TRACKING_TOKEN``,
    ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``), never fields.

    Example:
        .. code-block:: python

            from zipline_dagster.definitions import build_definitions
            from zipline_dagster.tracking import MlflowResource

            defs = build_definitions(
                models=[...],
                resources={"mlflow": MlflowResource(tracking_uri="http://mlflow:5000")},
            )
    """

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking server, e.g. http://mlflow:5000 (also the registry). "
        "Unset: MLflow is off.",
    )
    experiment: str = Field(
        default="{model}", description="The experiment of a model's runs; {model} is its name."
    )
    timeout_s: float = Field(
        default=5.0,
        description="The longest a step waits on one MLflow call; past it (or on an error) "
        "the step warns, skips MLflow and the champion's next evaluation logs what it missed.",
    )
    step_budget_s: float = Field(
        default=30.0,
        description="The most a step waits on MLflow in all (a range logs a run a day); "
        "past it the step skips MLflow, and the champion's next evaluation logs the rest.",
    )
    copy_artifacts: bool = Field(
        default=False,
        description="Copy a partition's model files into its MLflow run (default: a "
        "reference to their versioned URI).",
    )
    dagster_url: str | None = Field(
        default=None, description="The Dagster UI's URL, for the link from a run back to it."
    )

    @classmethod
    def from_settings(cls) -> MlflowResource:
        env = settings()
        return cls(
            tracking_uri=env.mlflow_tracking_uri,
            experiment=env.mlflow_experiment,
            copy_artifacts=env.mlflow_copy_artifacts,
            dagster_url=env.dagster_url,
        )

    def tracker(
        self, warn: Callable[[str], None], store: Callable[[str], BlobStore] = blob_store
    ) -> Tracker | None:
        """A tracker for one step (None when MLflow is off); ``warn`` gets what it skipped,
        ``store`` opens a model's storage (the step's ``WarehouseResource.store``) for
        ``copy_artifacts``."""
        return Tracker(self, warn, store) if self.tracking_uri else None

    def listening(
        self,
        warn: Callable[[str], None],
        info: Callable[[str], None],
        store: Callable[[str], BlobStore] = blob_store,
    ) -> MlflowListening | None:
        """The platform's events logged in MLflow for one step (None when it is off)."""
        tracker = self.tracker(warn, store)
        return MlflowListening(tracker, info) if tracker is not None else None


def mlflow_of(defs: dg.Definitions) -> MlflowResource:
    """The code location's MLflow: its ``mlflow`` resource, as its runs use it (the CLI
    moves the alias where the runs log); the settings' when it has none."""
    found = (defs.resources or {}).get("mlflow")
    return found if isinstance(found, MlflowResource) else MlflowResource.from_settings()


class MlflowListening:
    """One step's MLflow listener: every call bounded by its ``Tracker``."""

    def __init__(self, tracker: Tracker, info: Callable[[str], None]) -> None:
        self.tracker, self.info = tracker, info

    def partition_trained(self, event: PartitionTrained) -> dict[str, Any]:
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        partition = Partition(**fields)
        return metadata(self.tracker.log(partition))

    def partition_judged(self, event: PartitionJudged) -> None:
        p = _stored(event.store, event.model, event.asset_key, event.model.version, event.ds)
        if p is not None:  # the verdict as the MLflow run's tags
            self.tracker.log(replace(p, gates=dict(event.gates)))

    def champion_evaluated(self, event: ChampionEvaluated) -> dict[str, Any]:
        synced = sync(self.tracker, event)
        if synced is None:
            return {}
        if synced.logged:  # with or without a champion
            self.info(
                f"MLflow: logged {', '.join(synced.logged)} from storage, with their "
                "gates (missed while it was not reachable)"
            )
        if synced.registered:
            self.info(
                f"MLflow: registered earlier champions {', '.join(synced.registered)} "
                "(moved past while it was not reachable)"
            )
        if synced.put_back:
            self.tracker.warn(synced.put_back)
        if synced.url is None:
            return {}
        return {"mlflow_model_version": dg.MetadataValue.url(synced.url)}


def _stored(
    store: BlobStore,
    model: Model,
    asset_key: str,
    version: str,
    ds: str,
    judged: Callable[[str, str], Any] | None = None,
) -> Partition | None:
    """Partition ``version``/``ds`` of ``model`` as committed on storage, for MLflow
    (with ``judged``: its gates' verdict); None when it holds no finished model."""
    p = partition_from_storage(
        store,
        model=model.name,
        asset_key=asset_key,
        model_dir=model_dir_uri(model.model_artifact_base_uri, model.name, version, ds),
        ds=ds,
    )
    if p is None or judged is None:
        return p
    return replace(p, gates=dict(judged(version, ds)))


def sync(tracker: Tracker, event: ChampionEvaluated) -> Synced | None:
    """MLflow caught up with storage: a run for every trained partition of the model's
    version that has none (trained while MLflow was down), judged by its gates; the
    alias ``champion`` on the version of the pointer's partition (``moved``: the pointer
    moved just now, so an alias elsewhere is behind, not moved by hand)."""
    model, store, pointer = event.model, event.store, event.pointer

    def stored(version: str, ds: str) -> Partition | None:
        return _stored(store, model, event.asset_key, version, ds, event.judged)

    trained = {
        ds: attempt
        for ds in cp.trained_partitions(store, model)
        if (attempt := manifest_attempt(store, model_partition_uri(model, ds))) is not None
    }
    champion = None
    if pointer is not None:
        champion = stored(pointer.version, pointer.ds)
        if champion is not None and event.attempt_gone(pointer):
            champion = None  # trained again since it was judged: nothing to register

    def earlier(known: set[tuple[str, str]]) -> list[Partition]:
        """The earlier champions whose (version, ds) has no model version, each as its
        pointer judged it (a partition trained again since is left out)."""
        out: dict[str, Partition] = {}
        for pointer in cp.earlier_pointers(store, model):
            if (pointer.version, pointer.ds) in known:
                continue
            if event.attempt_gone(pointer):
                continue  # trained again since it was champion, or gone: nothing to register
            p = stored(pointer.version, pointer.ds)
            if p is not None:
                out.setdefault(p.key, p)
        return list(out.values())

    return tracker.sync(
        model.name,
        trained,
        lambda ds: stored(model.version, ds),
        champion,
        moved=event.moved,
        earlier=earlier,
    )
