"""Chronon-compatible model declarations, validated when they are constructed.

Everything here is plain Python with no Dagster, Ray or Spark import, so a code location
that declares models fails at load time (not at training time) with an error that names
the model, the field, the value given and what would be accepted.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zipline_dagster.declarations.deployment import DeploymentSpec, RolloutStrategy
from zipline_dagster.declarations.errors import ModelSpecError
from zipline_dagster.declarations.secrets import check_job_configs
from zipline_dagster.declarations.tasks import Task

VERSION_RE = re.compile(r"^[0-9a-f]{12,64}$")
#: What a version must be, for every message refusing one.
VERSION_ACCEPTED = (
    "12 to 64 lowercase hex characters (mutable tags like '1.0' or 'latest' are refused; "
    "`zipline-dagster build-trainer` prints it)"
)
MODEL_NAME_RE = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")
#: What a model name must be, for every message refusing one.
MODEL_NAME_ACCEPTED = f"a safe path segment matching {MODEL_NAME_RE.pattern.strip('^$')}"
# ns.name; a catalog-qualified cat.ns.name is accepted here so that the registry can
# report it as a near miss of the table an asset actually emits.
TABLE_RE = re.compile(r"^([A-Za-z0-9_]+\.)?[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

SUPPORTED_URI_SCHEMES = ("file", "s3", "gs", "abfss")


def _fail(model: str | None, fld: str, value: object, accepted: str) -> ModelSpecError:
    who = f"Model {model!r}" if model else "Model"
    return ModelSpecError(f"{who}: {fld}={value!r} is invalid; {accepted}.")


class TimeUnit(enum.Enum):
    DAYS = "DAYS"


class ModelBackend(enum.Enum):
    RAY = "RAY"


def is_day(value: object) -> bool:
    """``value`` is a day as partitions name it: ``YYYY-MM-DD``, a real date."""
    if not isinstance(value, str) or not DATE_RE.match(value):
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def selects(*columns: str, **aliased: str) -> dict[str, str]:
    """Chronon's ``selects``: ``selects("a", b="expr")`` -> ``{"a": "a", "b": "expr"}``."""
    out = {c: c for c in columns}
    out.update(aliased)
    return out


@dataclass(frozen=True)
class Query:
    """What a model reads of its training table.

    Args:
        selects: output column -> expression (``selects(...)`` builds it): the columns the
            trainer reads (passed as ``--columns``; each a plain column of the table).
        start_partition: the first day a window may read (YYYY-MM-DD); partitions whose
            window reaches before it do not exist.
        wheres: refused for a model's source (filter in the producer).

    Example:
        ``Query(selects=selects("price_log", "label"), start_partition="2026-07-01")``
    """

    selects: Mapping[str, str] = field(default_factory=dict)
    start_partition: str | None = None
    wheres: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.start_partition is not None and not is_day(self.start_partition):
            raise ModelSpecError(
                f"Query.start_partition={self.start_partition!r} is invalid; "
                "expected a day as YYYY-MM-DD."
            )


@dataclass(frozen=True)
class EventSource:
    """A daily-partitioned table a model trains on or a scores table reads.

    Args:
        table: ``namespace.name``, exactly as the asset producing it emits it.
        query: the columns read and the first day (``Query``).

    Example:
        ``EventSource(table="ctr.training_v1", query=Query(selects=selects("label")))``
    """

    table: str
    query: Query = field(default_factory=Query)

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or not TABLE_RE.match(self.table):
            raise ModelSpecError(
                f"EventSource.table={self.table!r} is invalid; expected 'namespace.name' "
                "with letters, digits and underscores (the exact name its producer emits)."
            )


@dataclass(frozen=True)
class Window:
    """A number of daily partitions: a model partition ``ds`` with a window of N days
    trains on exactly ``ds-(N-1)`` .. ``ds``.

    Args:
        length: N, a whole number >= 1.
        time_unit: ``TimeUnit.DAYS`` (partitions are daily).

    Example:
        ``Window(length=4, time_unit=TimeUnit.DAYS)``
    """

    length: int
    time_unit: TimeUnit = TimeUnit.DAYS

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ModelSpecError(
                f"Window.length={self.length!r} is invalid; expected a whole number >= 1."
            )
        if self.time_unit is not TimeUnit.DAYS:
            raise ModelSpecError(
                f"Window.time_unit={self.time_unit!r} is invalid; only TimeUnit.DAYS is "
                "supported (partitions are daily)."
            )

    @property
    def days(self) -> int:
        return self.length


#: The least memory a replica may hold: a Python process with xgboost and pyarrow.
MIN_REPLICA_MEMORY = 64 * 2**20


def _check_memory(memory: object) -> None:
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int) or memory < MIN_REPLICA_MEMORY
    ):
        raise ModelSpecError(
            f"ResourceConfig.memory_per_replica={memory!r} is invalid; expected bytes, a "
            f"whole number >= {MIN_REPLICA_MEMORY} (64 MiB), or None."
        )


@dataclass(frozen=True)
class ResourceConfig:
    """Ray worker counts. 0 workers: the job runs on one Ray process (the head).

    Args:
        min_replica_count: the fewest workers (whole number >= 0).
        max_replica_count: the most workers, the ones the job trains with; unset
            defaults to ``min_replica_count``; never below it.
        cpus_per_replica: CPUs each worker holds (> 0).
        memory_per_replica: bytes of memory each worker (with no workers: the trainer's
            process) holds, a whole number >= 64 MiB, or unset. Ray reserves it as the
            ``memory`` resource, and the trainer gets it as ``--memory-budget``: a
            reference trainer whose quantized training matrix would exceed it trains
            from external memory (a cache on the node's local disk), and its report
            says so.

    Example:
        ``ResourceConfig(min_replica_count=2)`` trains with 2 Ray Train workers;
        ``ResourceConfig(memory_per_replica=4 * 2**30)`` trains in one process of 4 GiB.
    """

    min_replica_count: int = 0
    max_replica_count: int | None = None
    cpus_per_replica: float = 1.0
    memory_per_replica: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_replica_count", "max_replica_count"):
            v = getattr(self, name)
            if v is None and name == "max_replica_count":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ModelSpecError(
                    f"ResourceConfig.{name}={v!r} is invalid; expected a whole number >= 0."
                )
        if self.max_replica_count is None:
            object.__setattr__(self, "max_replica_count", self.min_replica_count)
        assert self.max_replica_count is not None
        if self.min_replica_count > self.max_replica_count:
            raise ModelSpecError(
                f"ResourceConfig.min_replica_count={self.min_replica_count!r} is greater "
                f"than max_replica_count={self.max_replica_count!r}; min must be <= max."
            )
        if not isinstance(self.cpus_per_replica, (int, float)) or self.cpus_per_replica <= 0:
            raise ModelSpecError(
                f"ResourceConfig.cpus_per_replica={self.cpus_per_replica!r} is invalid; "
                "expected a number > 0."
            )
        _check_memory(self.memory_per_replica)

    @property
    def workers(self) -> int:
        """Workers to train with: the maximum the config allows."""
        assert self.max_replica_count is not None
        return self.max_replica_count


@dataclass(frozen=True)
class InferenceSpec:
    """How the model is served, and its name.

    Args:
        model_backend: ``ModelBackend.RAY``.
        model_backend_params: ``model_name`` (a safe path segment: it names the archive
            and the output directory) and ``model_type``.

    Example:
        ``InferenceSpec(model_backend_params={"model_name": "listing_ctr_model",
        "model_type": "custom"})``
    """

    model_backend: ModelBackend = ModelBackend.RAY
    model_backend_params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingSpec:
    """What a model trains on, and how.

    Args:
        training_data_source: the training table (``EventSource``).
        training_data_window: the days each partition trains on (``Window``).
        python_module: the trainer's entrypoint in its archive (``python -m``).
        resource_config: Ray workers (``ResourceConfig``).
        job_configs: ``--key=value`` flags for the trainer; the platform's own
            (``input-table``, ``start-ds``, ``end-ds``) and values that look like secrets
            are refused (pass environment variable names).

    Example:
        ``TrainingSpec(training_data_source=EventSource(table="ctr.training_v1"),
        training_data_window=Window(4), job_configs={"label-column": "label"})``
    """

    training_data_source: EventSource
    training_data_window: Window
    python_module: str = "trainer.train"
    resource_config: ResourceConfig = field(default_factory=ResourceConfig)
    job_configs: Mapping[str, str] = field(default_factory=dict)


def _check_versions(name: str, version: object, runtime_version: object) -> None:
    """The trainer's and the runtime's content addresses (the runtime's may be empty)."""
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise _fail(
            name,
            "version",
            version,
            f"expected the trainer archive's content address: {VERSION_ACCEPTED}",
        )
    if runtime_version and not (
        isinstance(runtime_version, str) and VERSION_RE.match(runtime_version)
    ):
        raise _fail(
            name,
            "runtime_version",
            runtime_version,
            f"expected the runtime build's content address (trainers.lock pins it): "
            f"{VERSION_ACCEPTED}, or empty for the installed runtime",
        )


@dataclass(frozen=True)
class Model:
    """A model trained on Ray from a content-addressed trainer archive.

    Args:
        version: the trainer archive's content address (12-64 lowercase hex chars).
        model_artifact_base_uri: where ``builds/`` and ``models/`` live
            (``file:///...``, ``s3://...``, ``gs://...``, ``abfss://...``).
        inference_spec: backend and ``model_backend_params["model_name"]``.
        training_conf: training data, window, entrypoint, resources and job configs.
        deployment_conf: rollout thresholds the champion pointer honours (optional).
        task: what it predicts (``Task`` or its value: ``"classification"``,
            ``"regression"``); monitoring computes that task's realized metrics. None:
            the trainer's report says (classification when it does not).
        description: shown in the Dagster UI; it changes no output, so it stales nothing.
        runtime_version: the content address of the job-side runtime its jobs run with,
            as the project pins it (``pinned_runtime(near=__file__)`` reads
            ``trainers.lock``); part of its code version. Empty: the runtime installed
            with the platform, so upgrading that re-versions the model: pin it.

    Example:
        ``Model(version="ab614e666667", model_artifact_base_uri="s3://bucket/warehouse",
        inference_spec=InferenceSpec(model_backend_params={"model_name": "m"}),
        training_conf=TrainingSpec(training_data_source=EventSource(table="ctr.t"),
        training_data_window=Window(4)))``

    Raises:
        ModelSpecError: at construction, naming the model, the field and the value.
    """

    version: str
    model_artifact_base_uri: str
    inference_spec: InferenceSpec
    training_conf: TrainingSpec
    deployment_conf: DeploymentSpec | None = None
    task: Task | str | None = None
    description: str = ""
    runtime_version: str = ""

    def __post_init__(self) -> None:
        params = dict(self.inference_spec.model_backend_params)
        name = params.get("model_name")
        if not isinstance(name, str) or not MODEL_NAME_RE.match(name):
            raise _fail(
                None,
                "inference_spec.model_backend_params['model_name']",
                name,
                f"expected {MODEL_NAME_ACCEPTED} "
                "(it names the trainer archive and the output directory)",
            )
        _check_versions(name, self.version, self.runtime_version)
        if self.inference_spec.model_backend is not ModelBackend.RAY:
            raise _fail(
                name,
                "inference_spec.model_backend",
                self.inference_spec.model_backend,
                "expected ModelBackend.RAY",
            )
        _check_base_uri(name, self.model_artifact_base_uri)
        _check_python_module(name, self.training_conf.python_module)
        check_job_configs(name, self.training_conf.job_configs)
        _check_training_query(name, self.training_conf.training_data_source.query)
        if self.deployment_conf is not None and not isinstance(
            self.deployment_conf, DeploymentSpec
        ):
            raise _fail(
                name,
                "deployment_conf",
                self.deployment_conf,
                "expected DeploymentSpec(rollout_strategy=RolloutStrategy(...))",
            )
        for metric in self.rollout.rollout_metric_thresholds:
            if (why := metric.problem()) is not None:
                raise ModelSpecError(f"Model {name!r}: deployment_conf: {why}.")
        if self.task is not None:
            try:
                object.__setattr__(self, "task", Task(self.task))
            except ValueError:
                raise _fail(
                    name,
                    "task",
                    self.task,
                    "expected one of " + ", ".join(repr(t.value) for t in Task),
                ) from None
        if not isinstance(self.description, str):
            raise _fail(name, "description", self.description, "expected a string")

    @property
    def rollout(self) -> RolloutStrategy:
        """The declared rollout strategy (no thresholds when none is declared)."""
        if self.deployment_conf is None:
            return RolloutStrategy()
        return self.deployment_conf.rollout_strategy

    @property
    def runtime(self) -> str:
        """The runtime build its jobs run with: the pinned one, else the installed one."""
        from zipline_dagster.packaging import installed_runtime

        return self.runtime_version or installed_runtime().version

    @property
    def name(self) -> str:
        return str(self.inference_spec.model_backend_params["model_name"])

    @property
    def table(self) -> str:
        return self.training_conf.training_data_source.table

    @property
    def window_days(self) -> int:
        return self.training_conf.training_data_window.days

    @property
    def columns(self) -> list[str]:
        """The training source's selected columns (the trainer's projection); [] = all."""
        return list(self.training_conf.training_data_source.query.selects)

    @property
    def first_partition(self) -> str | None:
        """The first day whose whole window lies on or after ``Query.start_partition``."""
        start = self.training_conf.training_data_source.query.start_partition
        if start is None:
            return None
        first = dt.date.fromisoformat(start) + dt.timedelta(days=self.window_days - 1)
        return first.isoformat()


def _check_base_uri(model: str, uri: Any) -> None:
    scheme = uri.split("://", 1)[0] if isinstance(uri, str) and "://" in uri else None
    if scheme not in SUPPORTED_URI_SCHEMES or not uri.split("://", 1)[1].strip("/"):
        raise _fail(
            model,
            "model_artifact_base_uri",
            uri,
            "expected a URI with a path: " + ", ".join(f"{s}://..." for s in SUPPORTED_URI_SCHEMES),
        )
    if scheme == "file" and not uri.startswith("file:///"):
        raise _fail(model, "model_artifact_base_uri", uri, "expected an absolute file:///path")


_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_training_query(model: str, query: Query) -> None:
    """A model's training query is a column projection and a first partition, nothing else.

    ``selects`` become the trainer's ``--columns``, so each must be a plain column of the
    training table (an expression belongs in the producer); ``wheres`` are refused rather
    than silently ignored (filter in the producer, whose output is versioned and fresh).
    """
    fld = "training_conf.training_data_source.query"
    if query.wheres:
        raise _fail(
            model,
            f"{fld}.wheres",
            tuple(query.wheres),
            "filters are not applied to training data; filter in the producer of the "
            "training table (a StagingQuery or the Join's left source) instead",
        )
    for name, expr in query.selects.items():
        if not (isinstance(name, str) and _COLUMN_RE.match(name)) or expr != name:
            raise _fail(
                model,
                f"{fld}.selects[{name!r}]",
                expr,
                "a model's selects are the columns the trainer reads, so each must be a plain "
                "column of the training table selected as itself (selects('price_log', "
                "'label')); compute expressions in the producer",
            )


def _check_python_module(model: str, module: Any) -> None:
    if not isinstance(module, str) or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", module):
        raise _fail(
            model,
            "training_conf.python_module",
            module,
            "expected a dotted module name such as 'trainer.train'",
        )
