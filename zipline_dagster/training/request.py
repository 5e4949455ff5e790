"""What one model partition's training run is: its window, flags, paths and artifacts.

Launcher-neutral: the Ray launcher and the local launcher both run the request built
here, so the flags, paths and report are identical whichever runs the trainer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import shlex
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from zipline_dagster.declarations.model import Model
from zipline_dagster.processes import holder_gone, lock_owner
from zipline_dagster.storage.blobs import BlobStorageError, BlobStore
from zipline_dagster.storage.paths import (
    MANIFEST_NAME,
    join_uri,
    model_archive_uri,
    model_partition_uri,
    table_uri,
)
from zipline_dagster.storage.tables import days_between, existing_partitions, format_days, shift_day
from zipline_dagster.training.trainer_io import ATTEMPTS_DIR, attempt_flags

REPORT_NAME = "metrics.json"
SUPERSEDED_DIR = "_superseded"
#: Each training attempt writes into its own folder (``trainer_io.ATTEMPTS_DIR``); only a
#: successful one is promoted into ``{version}/{ds}/``, so a failed retrain leaves the
#: finished model in place.
#: Left in an attempt folder once it was promoted (holds the manifest it became).
PROMOTED_NAME = "_PROMOTED.json"
#: Held while one run promotes an attempt into the partition folder.
PROMOTE_LOCK_NAME = "_PROMOTING.lock"
#: Ray Train checkpoints live beside the attempts (``--checkpoint-dir``), so a new
#: attempt resumes from an earlier one's; training state, not artifacts.
CHECKPOINTS_DIR = "_checkpoints"
_NOT_ARTIFACTS = (SUPERSEDED_DIR, ATTEMPTS_DIR, CHECKPOINTS_DIR, PROMOTE_LOCK_NAME, PROMOTED_NAME)


def _artifact_files(store: BlobStore, model_dir: str) -> list[str]:
    """Artifacts directly of ``model_dir``: not superseded ones, attempts or checkpoints."""
    out = []
    for uri in store.list(model_dir):
        first = uri[len(model_dir) :].lstrip("/").split("/", 1)[0]
        if first not in _NOT_ARTIFACTS:
            out.append(uri)
    return out


def attempt_dir(model_dir: str, attempt_id: str) -> str:
    """``{model_dir}/_attempts/{attempt_id}``: where one attempt's trainer writes."""
    return join_uri(model_dir, ATTEMPTS_DIR, attempt_id)


class TrainingDataError(RuntimeError):
    """The window's training data is missing or empty; names what is missing and what exists."""


class TrainingJobError(RuntimeError):
    """The trainer failed, was stopped or timed out; carries the job id and the log tail."""

    def __init__(
        self, message: str, *, job_id: str | None = None, logs_tail: str = "", logs: str = ""
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.logs_tail = logs_tail
        #: the whole log when it was read (a range job's per-partition results are in it)
        self.logs = logs


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
    #: the attempt folder the trainer wrote into
    model_dir: str = ""

    @property
    def job_url(self) -> str | None:
        return f"{self.dashboard_url}/#/jobs/{self.job_id}" if self.dashboard_url else None


class TrainingRunner(Protocol):
    """What a launcher returns: runs one partition's request to a finished job.

    The runner picks the attempt id, points the trainer at ``request.for_attempt(id)``
    and reports the attempt folder in ``JobOutcome.model_dir``; it never touches the
    partition folder itself (the model asset promotes a successful attempt).
    """

    def run(
        self,
        request: TrainingRequest,
        *,
        archive: bytes,
        requirements: list[str],
        metadata: dict[str, str],
    ) -> JobOutcome: ...


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
    #: the partition folder the finished model is promoted into; ``model_dir`` is the
    #: same until ``for_attempt`` points the trainer at an attempt folder below it
    canonical_dir: str = ""
    attempt_id: str | None = None
    #: the module run (default: the model's ``python_module``; scoring runs its
    #: inference module from the same archive)
    module: str = ""
    #: which flag names the attempt: ``model-dir`` (training: an attempt folder) or
    #: ``write-id`` (scoring: the attempt names the file it writes)
    attempt_flag: str = "model-dir"
    #: the stable id of the work (default ``{model}-{version}-{ds}``)
    job_key_override: str = ""
    #: CPUs the job's driver holds (default: the model's per-replica CPUs, none when it
    #: has Ray Train workers); a range job's driver only waits on its tasks and holds none
    driver_cpus: float | None = None
    #: the folder whose ``_attempts/`` holds the driver's end marker (default:
    #: ``canonical_dir``; scoring: the scores partition's folder, not the model's)
    marker_dir: str = ""

    def __post_init__(self) -> None:
        if not self.canonical_dir:
            object.__setattr__(self, "canonical_dir", self.model_dir)
        if not self.marker_dir:
            object.__setattr__(self, "marker_dir", self.canonical_dir)

    def for_attempt(self, attempt_id: str) -> TrainingRequest:
        """The same request with the trainer writing into ``_attempts/{attempt_id}``
        (or, for ``attempt_flag="write-id"``, naming its output after the attempt)."""
        flags = tuple(attempt_flags(list(self.flags), attempt_id, self.attempt_flag))
        if self.attempt_flag != "model-dir":
            return replace(self, flags=flags, attempt_id=attempt_id)
        adir = attempt_dir(self.canonical_dir, attempt_id)
        return replace(self, model_dir=adir, flags=flags, attempt_id=attempt_id)

    @property
    def scoring(self) -> bool:
        """A scores day: its attempt names the file it writes, not a folder."""
        return self.attempt_flag == "write-id"

    @property
    def start_ds(self) -> str:
        return self.days[0]

    @property
    def end_ds(self) -> str:
        return self.days[-1]

    @property
    def argv(self) -> list[str]:
        """``python -m {module} --k=v ...`` as an argument list (no shell)."""
        return ["python", "-m", self.module or self.model.training_conf.python_module, *self.flags]

    @property
    def entrypoint(self) -> str:
        """The same command as a shell string, each argument quoted."""
        return shlex.join(self.argv)

    @property
    def job_key(self) -> str:
        """Stable id of what is trained: (model, version, ds)."""
        return self.job_key_override or f"{self.model.name}-{self.model.version}-{self.ds}"


def trainer_flags(
    model: Model, *, start_ds: str, end_ds: str, warehouse: str, model_dir: str
) -> list[str]:
    """The one place ``job_configs`` become flags.

    Platform flags (never user-set) come first, then derived flags unless ``job_configs``
    overrides them (``--model-dir``, ``--warehouse``, ``--columns`` when the training
    source selects columns, ``--num-workers`` and ``--checkpoint-dir`` when the
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
    if model.columns:
        # the training source's selects: the only columns the trainer reads
        flags["columns"] = conf.pop("columns", ",".join(model.columns))
    workers = model.training_conf.resource_config.workers
    if workers > 0 or "num-workers" in conf:
        # distributed / fan-out trainers size themselves from it; the driver holds no CPU
        flags["num-workers"] = conf.pop("num-workers", str(workers))
    if workers > 0:
        # Checkpoints sit beside the attempt folders, so a new attempt resumes.
        flags["checkpoint-dir"] = conf.pop(
            "checkpoint-dir", join_uri(flags["model-dir"], CHECKPOINTS_DIR)
        )
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


def build_range_request(
    requests: list[TrainingRequest], *, key_prefix: str = ""
) -> TrainingRequest:
    """One Ray job that runs several partitions of one model as parallel tasks: a
    training range, or a scores range (requests whose ``module`` is the inference module
    and whose attempt names the file each day writes).

    Its entrypoint is the archive's ``zipline_trainer_io`` range driver; each partition
    keeps exactly its single-partition flags (its attempt, named after this job's
    submission id, set by the driver as for a job of its own), so the trainer cannot
    tell the two apart. The job key covers the range, so a retried step re-attaches to
    it: ``key_prefix`` (default ``{model}-{version}``), its first and last day, plus a
    hash of the days when they are not every day in between (a backfill of chosen days,
    or a retry that reuses some), so that a run never follows a job that trains another
    set of partitions. A scores range always adds a hash of every day's flags: each day
    names the model partition that scores it.
    """
    first, last = requests[0], requests[-1]
    model = first.model
    key = f"{key_prefix or f'{model.name}-{model.version}'}-{first.ds}_{last.ds}"
    days = [r.ds for r in requests]
    spec = json.dumps({r.ds: list(r.flags) for r in requests}, separators=(",", ":"))
    if first.scoring:
        key += "-" + hashlib.sha256(spec.encode()).hexdigest()[:8]
    elif days != days_between(first.ds, last.ds):
        key += "-" + hashlib.sha256(",".join(days).encode()).hexdigest()[:8]
    cpus = model.training_conf.resource_config.cpus_per_replica
    return TrainingRequest(
        model=model,
        ds=first.ds,
        warehouse=first.warehouse,
        days=tuple(sorted({d for r in requests for d in r.days})),
        model_dir=first.model_dir,
        archive_uri=first.archive_uri,
        flags=(
            "--attempt-id=",
            f"--module={first.module or model.training_conf.python_module}",
            # older drivers know model-dir only: a training range leaves the flag out
            *([f"--attempt-flag={first.attempt_flag}"] if first.scoring else []),
            f"--num-cpus={cpus:g}",
            f"--partitions={spec}",
        ),
        env=dict(first.env),
        module="zipline_trainer_io",
        attempt_flag="attempt-id",
        job_key_override=key,
        driver_cpus=0,
        marker_dir=first.marker_dir,
    )


def check_training_window(
    store: BlobStore, request: TrainingRequest, *, have: dict[str, int] | None = None
) -> dict[str, int]:
    """Fail before anything is submitted when a window partition is missing.

    ``have`` is the table's listing when the caller already has it (a range lists the
    table once for all its partitions).

    Returns:
        {ds: parquet file count} of the window.

    Raises:
        TrainingDataError: names the missing partitions and what the table has.
    """
    table = request.model.table
    if have is None:
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


def read_install_requires(archive: bytes, *, uri: str = "the trainer archive") -> list[str]:
    """``install_requires`` of the archive's ``setup.py``, read without executing it.

    Raises:
        TrainerArchiveError: it is not a literal list of strings (names the archive).
    """
    from zipline_dagster.training.archive import setup_keywords

    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/setup.py")]
        if not names:
            return []
        source = zf.read(names[0])
    found = setup_keywords(source, where=f"{uri}: {names[0]}")
    return [str(v) for v in found.get("install_requires", [])]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------
# Artifacts: superseding earlier attempts, the manifest commit marker, the report.


def supersede_previous(store: BlobStore, model_dir: str) -> str | None:
    """Move the partition's finished files aside, inside its own folder.

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
        store.move(uri, join_uri(dest, rel))  # a rename locally, a server copy elsewhere
    return dest


class PromotionLockError(ArtifactError):
    """Another run held the partition's promotion lock for too long."""


#: A promotion lock older than this belongs to a run that died holding it, and is broken.
STALE_LOCK_S = 600.0


@contextlib.contextmanager
def promotion_lock(
    store: BlobStore,
    model_dir: str,
    *,
    wait_s: float = 900.0,
    stale_s: float = STALE_LOCK_S,
    lock_name: str = PROMOTE_LOCK_NAME,
    left: list[str] | None = None,
) -> Iterator[None]:
    """Hold ``{model_dir}/_PROMOTING.lock`` while the partition folder changes.

    Two runs of one partition (both attached to the same Ray job, or a retrain racing a
    late one) promote one at a time, so neither moves the other's files. A lock older
    than ``stale_s`` belongs to a run that died mid-promotion and is broken; so is, at
    once, one whose holder this process can see has ended (same host and PID namespace:
    a step killed with ``kill -9``, retried on the same machine).

    ``left``: when given, a lock that cannot be deleted at the end is added to it rather
    than failing what the block did (the next promotion breaks it once stale).
    """
    uri = join_uri(model_dir, lock_name)
    owner = json.dumps(lock_owner())
    deadline = time.monotonic() + wait_s
    while not store.create_exclusive(uri, owner.encode()):
        try:
            held = json.loads(store.read_bytes(uri))
            age = time.time() - float(held.get("at", 0))
            gone = holder_gone(held)
        except Exception:  # vanished or half-visible: look again
            age, gone = 0.0, False
        if age > stale_s or gone:
            store.delete(uri)
            continue
        if time.monotonic() > deadline:
            raise PromotionLockError(
                f"{uri} has been held by another run for {age:.0f}s; the partition is left "
                "as it is. If no run is promoting it, delete the lock and retry."
            )
        time.sleep(0.2)
    try:
        yield
    finally:
        try:
            store.delete(uri)
        except (BlobStorageError, OSError):
            if left is None:
                raise
            left.append(uri)


@dataclass(frozen=True)
class Promotion:
    manifest: dict[str, Any]
    #: where the earlier finished model was moved, if there was one
    superseded: str | None
    #: True when another run had already promoted this very attempt
    already: bool
    #: the promoted attempt's report (None when ``already``: read it from the partition)
    report: dict[str, Any] | None = None
    #: what could not be deleted once the manifest was written (the attempt's copied
    #: files, the lock): tidying, never read, and never a failed promotion
    left_behind: list[str] = field(default_factory=list)


def read_json_object(store: BlobStore, uri: str) -> dict[str, Any] | None:
    """The JSON object stored at ``uri``; None when there is none, or it holds another
    JSON value (invalid JSON raises ValueError)."""
    try:
        value = json.loads(store.read_bytes(uri))
    except FileNotFoundError:
        return None
    return value if isinstance(value, dict) else None


def promote_attempt(
    store: BlobStore, model_dir: str, attempt_id: str, *, extra: dict[str, Any]
) -> Promotion:
    """Make a successful attempt the partition's finished model.

    Under the partition's lock: check the attempt's report, move the earlier finished
    model to ``_superseded/`` (manifest first), copy the attempt's files into place and
    write ``_MANIFEST.json`` (each file's SHA-256) last, as the commit marker. Promoting
    an attempt another run already promoted returns that manifest untouched.

    Raises:
        ArtifactError: the attempt wrote no valid report (the partition is untouched),
            or it was promoted earlier and has since been superseded by another attempt.
    """
    adir = attempt_dir(model_dir, attempt_id)
    manifest_uri = join_uri(model_dir, MANIFEST_NAME)
    left: list[str] = []
    with promotion_lock(store, model_dir, left=left):
        current = read_json_object(store, manifest_uri)
        if current and current.get("attempt") == attempt_id and is_committed(store, model_dir):
            return Promotion(manifest=current, superseded=None, already=True, left_behind=left)
        if store.exists(join_uri(adir, PROMOTED_NAME)):
            raise ArtifactError(
                f"attempt {attempt_id} was promoted into {model_dir} by another run and has "
                f"since been superseded (the partition now holds attempt "
                f"{(current or {}).get('attempt', 'none')}); nothing was changed"
            )
        files = [u for u in _artifact_files(store, adir) if not u.endswith("/" + MANIFEST_NAME)]
        if join_uri(adir, REPORT_NAME) not in files:
            raise ArtifactError(
                f"the trainer finished but wrote no {REPORT_NAME} into {adir} "
                f"(found: {[u[len(adir) + 1 :] for u in files] or 'nothing'}); the partition "
                f"{model_dir} is left as it was"
            )
        report = read_report(store, adir)
        superseded = supersede_previous(store, model_dir)
        entries = []
        for uri in files:
            rel = uri[len(adir) :].lstrip("/")
            # streamed (a model of gigabytes never sits in this process's memory), and the
            # digest is of what landed in place
            digest, size = store.copy(uri, join_uri(model_dir, rel))
            entries.append({"path": rel, "sha256": digest, "bytes": size})
        manifest = {
            "files": entries,
            "attempt": attempt_id,
            "committed_at": time.time(),
            **extra,
        }
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        store.write_bytes(manifest_uri, body)
        # The attempt folder keeps only a note of what it became. The note is what stops
        # a late run promoting this attempt over a newer one: its write may fail the step
        # (a retry finds the manifest and records it); deleting the copies never does.
        store.write_bytes(join_uri(adir, PROMOTED_NAME), body)
        for uri in files:
            try:
                store.delete(uri)
            except (BlobStorageError, OSError):
                left.append(uri)
        promotion = Promotion(
            manifest=manifest, superseded=superseded, already=False, report=report, left_behind=left
        )
    return promotion


def read_report(store: BlobStore, model_dir: str) -> dict[str, Any]:
    uri = join_uri(model_dir, REPORT_NAME)
    try:
        report = json.loads(store.read_bytes(uri))
    except ValueError as exc:
        raise ArtifactError(f"{uri} is not valid JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(report, dict):
        raise ArtifactError(f"{uri} holds {type(report).__name__}, expected a JSON object")
    return report


def committed_manifest(
    store: BlobStore, model_dir: str, *, checksums: bool = True
) -> dict[str, Any] | None:
    """The partition's manifest when it is a finished model (the manifest exists and every
    file it lists matches), else None.

    ``checksums=False`` checks that every listed file exists (one listing, no reads).
    """
    manifest = read_json_object(store, join_uri(model_dir, MANIFEST_NAME))
    if manifest is None:
        return None
    entries = manifest.get("files", [])
    if not checksums:
        present = set(_artifact_files(store, model_dir))
        whole = all(join_uri(model_dir, e["path"]) in present for e in entries)
        return manifest if whole else None
    for entry in entries:
        try:
            digest, _ = store.sha256(join_uri(model_dir, entry["path"]))
        except FileNotFoundError:
            return None
        if digest != entry["sha256"]:
            return None
    return manifest


def is_committed(store: BlobStore, model_dir: str, *, checksums: bool = True) -> bool:
    """A partition is a finished model only when its manifest exists and every file matches
    (``committed_manifest``)."""
    return committed_manifest(store, model_dir, checksums=checksums) is not None


def named_attempt(manifest: dict[str, Any] | None) -> str | None:
    """The attempt a partition's ``manifest`` names (None: no manifest, or one naming none)."""
    attempt = manifest.get("attempt") if manifest is not None else None
    return str(attempt) if attempt else None


def manifest_attempt(store: BlobStore, model_dir: str) -> str | None:
    """The attempt the partition's manifest names (``named_attempt``, read from storage)."""
    return named_attempt(read_json_object(store, join_uri(model_dir, MANIFEST_NAME)))


def unrecorded_attempt(
    manifest: dict[str, Any],
    recorded: str | None,
    *,
    run_status: str | None = None,
    run_finished: bool = True,
) -> str | None:
    """Why the finished model on storage (its ``manifest``) is not the one Dagster
    recorded for the partition (``recorded``: the attempt of its latest materialization),
    or None when they agree or nothing says. They differ when a run was stopped (killed,
    its machine lost) after it promoted its attempt and before Dagster recorded it: storage
    then holds a model that no materialization describes.

    With no materialization of the partition, ``run_status`` is the status of the run that
    promoted the model when that run is one of the instance's (``DagsterRunStatus`` value;
    ``run_finished``: whether Dagster counts it finished): the run then never recorded what
    it promoted, or has not yet. None: it is not (trained under another Dagster instance,
    say), and Dagster cannot tell."""
    held = named_attempt(manifest)
    if not held or held == recorded:
        return None
    run = manifest.get("dagster_run_id") or "unknown"
    if not recorded:
        if run_status is None:
            return None
        return (
            f"storage holds attempt {held}, promoted by run {run} ({run_status}), and Dagster "
            "has no materialization of the partition: "
            + (
                "the run ended without recording it (stopped between promoting its model "
                "and recording it, or its record was wiped)"
                if run_finished
                else "that run has not recorded it yet"
            )
        )
    return (
        f"storage holds attempt {held} (promoted by run {run}), not attempt {recorded} that "
        "Dagster recorded last: a run stopped between promoting its model and recording it"
    )
