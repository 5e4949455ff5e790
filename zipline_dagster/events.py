"""What the platform tells its listeners: a model partition trained, its gates judged,
its champion evaluated.

The core (``training``, ``rollout``) publishes these events to the listener the
definitions wire in as the ``mlflow`` resource (``PlatformListener``; its base does
nothing), and never imports a listener: ``tracking`` subscribes (MLflow runs, model
versions, the ``champion`` alias). A listener never fails or slows a step beyond its own
bounds; what it returns is materialization metadata (a link to what it recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import ChampionPointer

#: a gate's verdict as listeners get it: gate name -> (passed, summary)
Gates = Mapping[str, tuple[bool, str]]


@dataclass(frozen=True)
class PartitionTrained:
    """A model partition's attempt was promoted and committed (its manifest written)."""

    model: str
    asset_key: str
    ds: str
    version: str
    attempt: str
    artifact_uri: str
    report: Mapping[str, Any]
    dagster_run_id: str | None = None
    flags: Sequence[str] = ()
    files: Sequence[str] = ()


@dataclass(frozen=True)
class PartitionJudged:
    """A model partition's gates were evaluated (its blocking checks)."""

    model: Model
    asset_key: str
    store: BlobStore
    ds: str
    gates: Gates


@dataclass(frozen=True)
class ChampionEvaluated:
    """The champion asset decided (moved or stayed). ``judged``: the gates of a trained
    partition (version, ds) as they judge it now; ``attempt_gone``: whether a pointer's
    attempt is no longer the partition's (trained again since, or gone)."""

    model: Model
    asset_key: str
    store: BlobStore
    pointer: ChampionPointer | None
    moved: bool
    judged: Callable[[str, str], Gates]
    attempt_gone: Callable[[ChampionPointer], bool]


class Listening(Protocol):
    """A listener for one step (``PlatformListener.listening``)."""

    def partition_trained(self, event: PartitionTrained) -> dict[str, Any]:
        """The materialization's metadata for what was recorded (may be empty)."""
        ...

    def partition_judged(self, event: PartitionJudged) -> None: ...

    def champion_evaluated(self, event: ChampionEvaluated) -> dict[str, Any]:
        """The champion materialization's metadata for what was recorded."""
        ...


class PlatformListener(dg.ConfigurableResource):
    """The resource the core publishes its events to (key ``mlflow``); this base listens
    to nothing. ``tracking.MlflowResource`` is the listener the platform ships.

    Example:
        .. code-block:: python

            from zipline_dagster.definitions import build_definitions
            from zipline_dagster.events import PlatformListener

            class AuditListener(PlatformListener):  # another listener than MLflow
                def listening(self, warn, info, store):
                    return MyAuditLog(info)  # partition_trained, partition_judged, champion_evaluated

            defs = build_definitions(models=[...], resources={"mlflow": AuditListener()})
    """

    def listening(
        self,
        warn: Callable[[str], None],
        info: Callable[[str], None],
        store: Callable[[str], BlobStore],
    ) -> Listening | None:
        """A listener for one step (None: nothing listens); ``warn`` and ``info`` go to
        the step's log, ``store`` opens storage as the step does."""
        return None
