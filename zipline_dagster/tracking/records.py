"""The MLflow hand-off's records: a model partition attempt as MLflow gets it
(``Partition``, read back from storage by ``partition_from_storage``), what logging and
syncing did (``Logged``, ``Synced``), the tags that identify runs, and a
materialization's link to its run (``metadata``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from zipline_dagster.events import PartitionTrained
from zipline_dagster.storage.artifacts import read_report
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStore
from zipline_dagster.storage.manifests import read_manifest

#: The training attempt (job) an MLflow run is of.
ATTEMPT_TAG = "zipline.attempt"
#: ``{ds}/{attempt}``: a run's (and a model version's) identity, set on a run once it is
#: complete (finished, everything logged).
IDENTITY_TAG = "zipline.partition_attempt"
#: The identity a run is being logged for, until it is complete: a run left with only
#: this one (a process killed mid-way, a request whose answer was lost) is never taken
#: for the attempt's, and is deleted once the attempt has a complete run.
PENDING_TAG = "zipline.logging"
#: The verdict of a run's gates: ``passed``, or ``failed: `` and the gates that failed.
GATES_TAG = "zipline.gates"
CHAMPION_ALIAS = "champion"
#: Object stores a model version's source may name directly; a local (file://) source
#: is refused by MLflow's server, so such a version's source is the run's ``model/``.
REMOTE_SCHEMES = ("s3", "gs", "gcs", "abfss", "abfs", "wasbs", "hdfs", "dbfs")
_MAX_PARAM = 6000
MAX_TAG = 5000


@dataclass(frozen=True)
class Partition(PartitionTrained):
    """One model partition attempt, as MLflow gets it: as trained, with its gates."""

    #: gate name -> (passed, summary); None: not judged yet
    gates: Mapping[str, tuple[bool, str]] | None = None

    @property
    def key(self) -> str:
        """Its identity in MLflow (``IDENTITY_TAG``)."""
        return f"{self.ds}/{self.attempt}"


@dataclass(frozen=True)
class Logged:
    run_id: str
    url: str


@dataclass(frozen=True)
class Synced:
    """What a sync did: the partitions it logged (missed earlier), and the model version
    the alias ``champion`` is on (None: no champion)."""

    #: the days logged or judged now (missed earlier)
    logged: list[str]
    version: str | None = None
    url: str | None = None
    #: the warning when the alias had been elsewhere (moved by hand, or behind)
    put_back: str | None = None
    #: earlier champions (``version/ds``) registered now (missed earlier)
    registered: list[str] = field(default_factory=list)


def partition_from_storage(
    store: BlobStore, *, model: str, asset_key: str, model_dir: str, ds: str
) -> Partition | None:
    """The committed attempt of the partition at ``model_dir`` (None: no manifest)."""
    manifest = read_manifest(store, model_dir)
    attempt = manifest.attempt if manifest is not None else None
    if manifest is None or attempt is None:
        return None
    try:
        report = read_report(store, model_dir)
    except BlobNotFoundError:
        report = {}
    return Partition(
        model=model,
        asset_key=asset_key,
        ds=ds,
        version=manifest.version or "",
        attempt=attempt,
        artifact_uri=model_dir,
        report=report,
        dagster_run_id=manifest.run_id,
        flags=manifest.flags,
        files=tuple(manifest.paths),
    )


def flag_params(flags: Iterable[str]) -> dict[str, str]:
    """``--name=value`` flags as params (a bare ``--name`` is ``true``)."""
    out = {}
    for flag in flags:
        name, eq, value = flag.lstrip("-").partition("=")
        out[name] = (value if eq else "true")[:_MAX_PARAM]
    return out


#: a URI's ``user:password@``, wherever an error message quotes it
_USERINFO = re.compile(r"//[^/\s@]+@")


def shown_uri(uri: str) -> str:
    """``uri`` without any user or password in it."""
    return _USERINFO.sub("//", uri)


def metadata(logged: Logged | None) -> dict[str, Any]:
    """A materialization's link to its MLflow run (nothing when MLflow was skipped)."""
    return {} if logged is None else {"mlflow_run": dg.MetadataValue.url(logged.url)}
