"""What one model partition's training run is: its window, flags, paths and artifacts.

Launcher-neutral: the Ray launcher and the local launcher both run the request built
here, so the flags, paths and report are identical whichever runs the trainer.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import shlex
import zipfile
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

from zipline_runtime.contract import TableRead, TrainingInvocation
from zipline_runtime.driver import DRIVER_MODULE, attempt_flags, driver_argv

from zipline_dagster.declarations.model import Model
from zipline_dagster.jobs.cost import Usage
from zipline_dagster.packaging import RuntimeArchive
from zipline_dagster.storage.artifacts import attempt_dir
from zipline_dagster.storage.days import days_between, format_days, shift_day
from zipline_dagster.storage.manifests import CHECKPOINTS_DIR
from zipline_dagster.storage.paths import (
    join_uri,
    model_archive_uri,
    model_partition_uri,
)


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
    #: what the trainer's process used, where the launcher measured it (the local one)
    usage: Usage | None = None

    @property
    def job_url(self) -> str | None:
        return f"{self.dashboard_url}/#/jobs/{self.job_id}" if self.dashboard_url else None


class TrainingRunner(Protocol):
    """What a launcher returns: runs one partition's request to a finished job.

    The runner picks the attempt id, points the trainer at ``request.for_attempt(id)``
    and reports the attempt folder in ``JobOutcome.model_dir``; it never touches the
    partition folder itself (the model asset promotes a successful attempt). The job runs
    with ``runtime``, the model's runtime build (``jobs.runtime.ship_runtime``), beside
    the archive.
    """

    def run(
        self,
        request: JobRequest,
        *,
        archive: bytes,
        runtime: RuntimeArchive,
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


def window_days(ds: str, length: int) -> list[str]:
    """A window of N days ending at ``ds``: exactly ``ds-(N-1)`` .. ``ds``, inclusive."""
    return days_between(shift_day(ds, -(length - 1)), ds)


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """What every job is, whatever its kind (``TrainingJob``, ``ScoringJob``,
    ``RangeJob``): the module it runs from which trainer archive, its flags, the stable
    key of its work and where its driver leaves its end marker. Each field is set by the
    builder of its kind; none is a placeholder filled in later."""

    model: Model
    ds: str
    warehouse: str
    days: tuple[str, ...]
    #: where the job writes (a trainer: its attempt folder once ``for_attempt`` points it
    #: there) or reads the model from (a scores day: the partition that scores it)
    model_dir: str
    archive_uri: str
    #: the trainer version whose archive runs it (scoring by a champion or challenger of
    #: another version runs that version's archive)
    version: str
    #: every flag, platform ones first, then job_configs, as ``--key=value``
    flags: tuple[str, ...]
    #: the module run: the model's ``python_module``, its inference module, or the driver
    module: str
    #: the stable id of the work: a retried step re-attaches to a live job of the same key
    job_key: str
    #: the folder whose ``_attempts/`` holds the driver's end marker
    marker_dir: str
    env: dict[str, str] = field(default_factory=dict)
    attempt_id: str | None = None
    #: the flag that names an attempt (``zipline_runtime.driver.ATTEMPT_FLAGS``)
    attempt_flag: ClassVar[str] = "model-dir"

    def for_attempt(self, attempt_id: str) -> JobRequest:
        """The same request with its attempt named ``attempt_id``."""
        flags = tuple(attempt_flags(list(self.flags), attempt_id, self.attempt_flag))
        return replace(self, flags=flags, attempt_id=attempt_id)

    @property
    def scoring(self) -> bool:
        """A scores day (or a range of them): each attempt names the file it writes."""
        return False

    @property
    def driver_cpus(self) -> float:
        """CPUs the job's driver holds: the model's per-replica CPUs when the trainer is
        the driver, none when it has Ray Train workers (they need them)."""
        resources = self.model.training_conf.resource_config
        return resources.cpus_per_replica if resources.workers == 0 else 0

    @property
    def threads_env(self) -> dict[str, str]:
        """``OMP_NUM_THREADS`` of the CPUs the job's driver holds (Ray sets it for tasks,
        not for a job's entrypoint): a trainer's default threads (``--nthread 0``) are
        the CPUs its job was given, never every core of a machine it shares. Empty when
        the driver holds none (its Ray tasks and workers get theirs from Ray)."""
        cpus = self.driver_cpus
        return {"OMP_NUM_THREADS": str(max(1, int(cpus)))} if cpus > 0 else {}

    @property
    def driver_memory(self) -> int | None:
        """Bytes of memory the job's driver holds (Ray's ``memory`` resource): the
        model's per-replica memory when the trainer is the driver, else none."""
        resources = self.model.training_conf.resource_config
        return resources.memory_per_replica if resources.workers == 0 else None

    @property
    def start_ds(self) -> str:
        return self.days[0]

    @property
    def end_ds(self) -> str:
        return self.days[-1]

    @property
    def argv(self) -> list[str]:
        """``python -m {module} --k=v ...`` as an argument list (no shell)."""
        return ["python", "-m", self.module, *self.flags]

    @property
    def entrypoint(self) -> str:
        """The same command as a shell string, each argument quoted."""
        return shlex.join(self.argv)


@dataclass(frozen=True, kw_only=True)
class TrainingJob(JobRequest):
    """A model partition's training: the trainer writes into an attempt folder below
    ``canonical_dir``, which the model asset promotes into place when it succeeded."""

    #: the partition folder the finished model is promoted into
    canonical_dir: str
    #: what the trainer is given, typed (``flags`` is its form, before the attempt)
    invocation: TrainingInvocation

    def for_attempt(self, attempt_id: str) -> JobRequest:
        """The trainer pointed at ``{canonical_dir}/_attempts/{attempt_id}``."""
        job = super().for_attempt(attempt_id)
        return replace(job, model_dir=attempt_dir(self.canonical_dir, attempt_id))


def as_training(request: JobRequest) -> TrainingJob:
    """``request`` as the training job it is (a step of model partitions made it).

    Raises:
        TypeError: it is another kind of job.
    """
    if not isinstance(request, TrainingJob):
        raise TypeError(f"job {request.job_key} is a {type(request).__name__}, not a TrainingJob")
    return request


@dataclass(frozen=True, kw_only=True)
class ScoringJob(JobRequest):
    """A scores day: the inference module of the partition that scores it; its attempt
    names the file it stages (``--write-id``)."""

    attempt_flag: ClassVar[str] = "write-id"

    @property
    def scoring(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class RangeJob(JobRequest):
    """Several days of one model in one job, under the runtime's driver, one Ray task a
    day; the driver holds no CPU (it only waits on its tasks)."""

    #: whether its days are scores days
    scores: bool
    attempt_flag: ClassVar[str] = "attempt-id"

    @property
    def scoring(self) -> bool:
        return self.scores

    @property
    def driver_cpus(self) -> float:
        return 0

    @property
    def driver_memory(self) -> int | None:
        return None


def training_invocation(
    model: Model,
    *,
    start_ds: str,
    end_ds: str,
    warehouse: str,
    model_dir: str,
    table: TableRead | None = None,
) -> TrainingInvocation:
    """The one place ``job_configs`` become a trainer's invocation (its flags:
    ``TrainingInvocation.to_flags``).

    Platform flags (never user-set) come first, then derived flags unless ``job_configs``
    overrides them (``--model-dir``, ``--warehouse``, ``--columns`` when the training
    source selects columns, ``--num-workers`` and ``--checkpoint-dir`` when the
    ResourceConfig asks for workers), then every ``job_configs`` entry as ``--key=value``.
    """
    conf = dict(model.training_conf.job_configs)
    read = table if table is not None else TableRead(model.table)
    model_dir = conf.pop("model-dir", model_dir)
    options: dict[str, str] = {}
    if model.columns:
        # the training source's selects: the only columns the trainer reads
        options["columns"] = conf.pop("columns", ",".join(model.columns))
    workers = model.training_conf.resource_config.workers
    if workers > 0 or "num-workers" in conf:
        # distributed / fan-out trainers size themselves from it; the driver holds no CPU
        options["num-workers"] = conf.pop("num-workers", str(workers))
    memory = model.training_conf.resource_config.memory_per_replica
    if memory is not None:
        # a worker's (or the in-process trainer's) memory budget: the matrix it builds
        options["memory-budget"] = conf.pop("memory-budget", str(memory))
    if workers > 0:
        # Checkpoints sit beside the attempt folders, so a new attempt resumes.
        options["checkpoint-dir"] = conf.pop("checkpoint-dir", join_uri(model_dir, CHECKPOINTS_DIR))
    return TrainingInvocation(
        read=read,
        start_ds=start_ds,
        end_ds=end_ds,
        model_dir=model_dir,
        warehouse=conf.pop("warehouse", warehouse),
        options=tuple({**options, **conf}.items()),
    )


def build_training_request(
    model: Model, ds: str, *, warehouse: str, table: TableRead | None = None
) -> TrainingJob:
    dt.date.fromisoformat(ds)
    days = window_days(ds, model.window_days)
    derived_dir = model_partition_uri(model, ds)
    model_dir = model.training_conf.job_configs.get("model-dir", derived_dir)
    warehouse = model.training_conf.job_configs.get("warehouse", warehouse)
    invocation = training_invocation(
        model,
        start_ds=days[0],
        end_ds=days[-1],
        warehouse=warehouse,
        model_dir=model_dir,
        table=table,
    )
    env = {}
    if model.training_conf.resource_config.workers > 0:
        # Ray Train's controller polls its workers every 2 s by default, and each reported
        # round waits for a poll: a short run would be mostly that wait
        env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
    return TrainingJob(
        model=model,
        ds=ds,
        warehouse=warehouse,
        days=tuple(days),
        model_dir=model_dir,
        canonical_dir=model_dir,
        archive_uri=model_archive_uri(model),
        version=model.version,
        flags=tuple(invocation.to_flags()),
        invocation=invocation,
        module=model.training_conf.python_module,
        job_key=f"{model.name}-{model.version}-{ds}",
        marker_dir=model_dir,
        env=env,
    )


def build_range_request(requests: list[JobRequest], *, key_prefix: str = "") -> RangeJob:
    """One Ray job that runs several partitions of one model as parallel tasks: a
    training range, or a scores range (requests whose ``module`` is the inference module
    and whose attempt names the file each day writes).

    Its entrypoint is the runtime's driver (``zipline_runtime.driver``); each partition
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
    # the driver's flags; its attempt id is set by ``for_attempt`` (``attempt_flag``)
    flags = driver_argv(
        "", first.module, json.loads(spec), attempt_flag=first.attempt_flag, num_cpus=cpus
    )[3:]
    return RangeJob(
        model=model,
        ds=first.ds,
        warehouse=first.warehouse,
        days=tuple(sorted({d for r in requests for d in r.days})),
        model_dir=first.model_dir,
        archive_uri=first.archive_uri,
        version=first.version,
        flags=tuple(flags),
        env=dict(first.env),
        module=DRIVER_MODULE,
        job_key=key,
        marker_dir=first.marker_dir,
        scores=first.scoring,
    )


def check_training_window(model: Model, ds: str, days: list[str], *, have: dict[str, int]) -> None:
    """Fail before anything is submitted when a window partition is missing.

    ``have``: {ds: data file count} of the table's committed days, at least those of the
    window (a range reads the catalog once for all its partitions' windows).

    Raises:
        TrainingDataError: names the missing partitions and what the table has.
    """
    table = model.table
    missing = [d for d in days if d not in have]
    if missing:
        raise TrainingDataError(
            f"model {model.name!r} partition {ds}: training table {table} "
            f"is missing partitions {format_days(missing)} "
            f"of the window {days[0]}..{days[-1]}; of those the table has "
            f"{format_days(sorted(have))}. Materialize the upstream partitions first "
            "(a backfill of the model does it)."
        )


def read_install_requires(archive: bytes, *, uri: str = "the trainer archive") -> list[str]:
    """``install_requires`` of the archive's ``setup.py``, read without executing it.

    Raises:
        TrainerArchiveError: it is not a literal list of strings (names the archive).
    """
    from zipline_dagster.jobs.archive import setup_keywords

    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/setup.py")]
        if not names:
            return []
        source = zf.read(names[0])
    found = setup_keywords(source, where=f"{uri}: {names[0]}")
    return [str(v) for v in found.get("install_requires", [])]  # type: ignore[attr-defined]
