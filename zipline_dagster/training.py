"""What one model partition's training run is: its window, flags, paths and artifacts.

Launcher-neutral: the Ray launcher and the local launcher both run the request built
here, so the flags, paths and report are identical whichever runs the trainer.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import io
import json
import shlex
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

from zipline_dagster.paths import (
    MANIFEST_NAME,
    join_uri,
    model_archive_uri,
    model_partition_uri,
    table_uri,
)
from zipline_dagster.spec import Model
from zipline_dagster.storage import BlobStore
from zipline_dagster.tables import days_between, existing_partitions, format_days, shift_day

REPORT_NAME = "metrics.json"
SUPERSEDED_DIR = "_superseded"
#: Ray Train checkpoints stay in place across attempts, so a restarted job resumes; they
#: are training state, not artifacts, and are left out of the manifest.
CHECKPOINTS_DIR = "_checkpoints"


def _artifact_files(store: BlobStore, model_dir: str) -> list[str]:
    """Files of the current attempt: not superseded ones, not checkpoints."""
    skip = (f"/{SUPERSEDED_DIR}/", f"/{CHECKPOINTS_DIR}/")
    return [u for u in store.list(model_dir) if not any(s in u[len(model_dir) :] for s in skip)]


class TrainingDataError(RuntimeError):
    """The window's training data is missing or empty; names what is missing and what exists."""


class TrainingJobError(RuntimeError):
    """The trainer failed, was stopped or timed out; carries the job id and the log tail."""

    def __init__(self, message: str, *, job_id: str | None = None, logs_tail: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
        self.logs_tail = logs_tail


@dataclass(frozen=True)
class JobOutcome:
    """A finished training job, whichever launcher ran it."""

    job_id: str
    status: str
    dashboard_url: str | None
    attached: bool
    seconds: float
    logs: str
    launcher: str = "ray"

    @property
    def job_url(self) -> str | None:
        return f"{self.dashboard_url}/#/jobs/{self.job_id}" if self.dashboard_url else None


def traceback_tail(logs: str, max_lines: int = 40) -> str:
    """The trainer's own traceback (from the last 'Traceback'), else the last lines."""
    lines = logs.rstrip().splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")
    ]
    tail = lines[starts[-1] :] if starts else lines
    return "\n".join(tail[-max_lines:])


class ArtifactError(RuntimeError):
    """The trainer finished but its artifacts are not what the contract requires."""


def window_days(ds: str, length: int) -> list[str]:
    """A window of N days ending at ``ds``: exactly ``ds-(N-1)`` .. ``ds``, inclusive."""
    return days_between(shift_day(ds, -(length - 1)), ds)


@dataclass(frozen=True)
class TrainingRequest:
    model: Model
    ds: str
    warehouse: str
    days: tuple[str, ...]
    model_dir: str
    archive_uri: str
    #: every flag, platform ones first, then job_configs, as ``--key=value``
    flags: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def start_ds(self) -> str:
        return self.days[0]

    @property
    def end_ds(self) -> str:
        return self.days[-1]

    @property
    def argv(self) -> list[str]:
        """``python -m {module} --k=v ...`` as an argument list (no shell)."""
        return ["python", "-m", self.model.training_conf.python_module, *self.flags]

    @property
    def entrypoint(self) -> str:
        """The same command as a shell string, each argument quoted."""
        return shlex.join(self.argv)

    @property
    def job_key(self) -> str:
        """Stable id of what is trained: (model, version, ds)."""
        return f"{self.model.name}-{self.model.version}-{self.ds}"


def trainer_flags(
    model: Model, *, start_ds: str, end_ds: str, warehouse: str, model_dir: str
) -> list[str]:
    """The one place ``job_configs`` become flags.

    Platform flags (never user-set) come first, then derived flags unless ``job_configs``
    overrides them (``--model-dir``, ``--warehouse``, and ``--num-workers`` when the
    ResourceConfig asks for workers), then every ``job_configs`` entry as ``--key=value``.
    """
    conf = dict(model.training_conf.job_configs)
    flags = {
        "input-table": model.table,
        "start-ds": start_ds,
        "end-ds": end_ds,
        "model-dir": conf.pop("model-dir", model_dir),
        "warehouse": conf.pop("warehouse", warehouse),
    }
    workers = model.training_conf.resource_config.workers
    if workers > 0 or "num-workers" in conf:
        # distributed / fan-out trainers size themselves from it; the driver holds no CPU
        flags["num-workers"] = conf.pop("num-workers", str(workers))
    flags.update(conf)
    return [f"--{k}={v}" for k, v in flags.items()]


def build_training_request(model: Model, ds: str, *, warehouse: str) -> TrainingRequest:
    dt.date.fromisoformat(ds)
    days = window_days(ds, model.window_days)
    derived_dir = model_partition_uri(model, ds)
    model_dir = model.training_conf.job_configs.get("model-dir", derived_dir)
    warehouse = model.training_conf.job_configs.get("warehouse", warehouse)
    flags = trainer_flags(
        model, start_ds=days[0], end_ds=days[-1], warehouse=warehouse, model_dir=model_dir
    )
    env = {}
    if model.training_conf.resource_config.workers > 0:
        # Ray Train's controller polls workers every 2 s by default, which costs ~2 s per
        # reported round; 0.2 s halves a short run (RAY_NOTES.md).
        env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
    return TrainingRequest(
        model=model,
        ds=ds,
        warehouse=warehouse,
        days=tuple(days),
        model_dir=model_dir,
        archive_uri=model_archive_uri(model),
        flags=tuple(flags),
        env=env,
    )


def check_training_window(store: BlobStore, request: TrainingRequest) -> dict[str, int]:
    """Fail before anything is submitted when a window partition is missing.

    Returns:
        {ds: parquet file count} of the window.

    Raises:
        TrainingDataError: names the missing partitions and what the table has.
    """
    table = request.model.table
    have = existing_partitions(store, request.warehouse, table)
    missing = [d for d in request.days if d not in have]
    if missing:
        raise TrainingDataError(
            f"model {request.model.name!r} partition {request.ds}: training table {table} "
            f"({table_uri(request.warehouse, table)}) is missing partitions {format_days(missing)} "
            f"of the window {request.start_ds}..{request.end_ds}; the table has "
            f"{format_days(sorted(have))}. Materialize the upstream partitions first "
            "(a backfill of the model does it)."
        )
    return {d: have[d] for d in request.days}


def read_install_requires(archive: bytes) -> list[str]:
    """``install_requires`` of the archive's ``setup.py``, read without executing it."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/setup.py")]
        if not names:
            return []
        tree = ast.parse(zf.read(names[0]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "install_requires":
                    value = ast.literal_eval(kw.value)
                    return [str(v) for v in value]
    return []


# ---------------------------------------------------------------------------------------
# Artifacts: superseding earlier attempts, the manifest commit marker, the report.


def supersede_previous(store: BlobStore, model_dir: str) -> str | None:
    """Move an earlier attempt's files aside, inside this partition's own folder.

    The manifest goes first, so a crash mid-way never leaves the partition looking
    finished; the rest lands in ``{model_dir}/_superseded/{UTC stamp}/`` and stays
    recoverable. Returns that folder, or None when the partition was empty.
    """
    current = _artifact_files(store, model_dir)
    if not current:
        return None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    dest = join_uri(model_dir, SUPERSEDED_DIR, stamp)
    manifest = join_uri(model_dir, MANIFEST_NAME)
    ordered = sorted(current, key=lambda u: u != manifest)  # manifest first
    for uri in ordered:
        rel = uri[len(model_dir) :].lstrip("/")
        store.write_bytes(join_uri(dest, rel), store.read_bytes(uri))
        store.delete(uri)
    return dest


def write_manifest(store: BlobStore, model_dir: str, *, extra: dict[str, Any]) -> dict[str, Any]:
    """Checksum every artifact and write ``_MANIFEST.json`` last, as the commit marker.

    Raises:
        ArtifactError: the trainer wrote no report (``metrics.json``) or the report is not
            valid JSON; nothing is committed then.
    """
    files = [u for u in _artifact_files(store, model_dir) if not u.endswith("/" + MANIFEST_NAME)]
    report_uri = join_uri(model_dir, REPORT_NAME)
    if report_uri not in files:
        raise ArtifactError(
            f"the trainer finished but wrote no {REPORT_NAME} into {model_dir} "
            f"(found: {[u[len(model_dir) + 1 :] for u in files] or 'nothing'}); the partition is "
            "left uncommitted (no manifest)"
        )
    entries = []
    for uri in files:
        data = store.read_bytes(uri)
        entries.append(
            {
                "path": uri[len(model_dir) :].lstrip("/"),
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
            }
        )
    manifest = {"files": entries, "committed_at": time.time(), **extra}
    store.write_bytes(
        join_uri(model_dir, MANIFEST_NAME), json.dumps(manifest, indent=2, sort_keys=True).encode()
    )
    return manifest


def read_report(store: BlobStore, model_dir: str) -> dict[str, Any]:
    uri = join_uri(model_dir, REPORT_NAME)
    try:
        report = json.loads(store.read_bytes(uri))
    except ValueError as exc:
        raise ArtifactError(f"{uri} is not valid JSON: {exc}") from None
    if not isinstance(report, dict):
        raise ArtifactError(f"{uri} holds {type(report).__name__}, expected a JSON object")
    return report


def is_committed(store: BlobStore, model_dir: str) -> bool:
    """A partition is a finished model only when its manifest exists and every file matches."""
    uri = join_uri(model_dir, MANIFEST_NAME)
    if not store.exists(uri):
        return False
    manifest = json.loads(store.read_bytes(uri))
    for entry in manifest.get("files", []):
        f = join_uri(model_dir, entry["path"])
        if (
            not store.exists(f)
            or hashlib.sha256(store.read_bytes(f)).hexdigest() != entry["sha256"]
        ):
            return False
    return True
