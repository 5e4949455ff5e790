"""What ``zipline-dagster new-model`` writes: a model's defs file, from its task.

The file declares the model (pinned by ``trainers.lock``), its gates for the task, and a
scores table with its monitoring: day ``ds`` of the training table scored by the newest
partition at or before ``ds-1`` passing its gates, and monitored against the same
table's label column (the task's realized metrics). The trainer is a copy of the
reference trainer of the task (``TEMPLATES``).
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zipline_dagster.declarations.tasks import Task

#: The reference trainer (a ``trainers/`` folder) each task's scaffold copies.
TEMPLATES = {Task.CLASSIFICATION: "listing_ctr_model", Task.REGRESSION: "listing_price_model"}
#: The gate each task's scaffold declares (a minimum), and its default threshold.
GATES = {Task.CLASSIFICATION: ("holdout_auc", 0.6), Task.REGRESSION: ("holdout_r2", 0.5)}
#: The demo training table's columns each task's scaffold reads by default.
DEFAULT_FEATURES = {
    Task.CLASSIFICATION: "price_log,inventory_count,clicked_count_7d,clicked_sum_7d,"
    "clicked_sum_1d,price_avg_7d",
    Task.REGRESSION: "inventory_count,clicked_count_7d,clicked_sum_7d,price_avg_7d",
}
DEFAULT_LABELS = {Task.CLASSIFICATION: "label", Task.REGRESSION: "price_log"}

MODEL_TEMPLATE = '''"""{name}: scaffolded by `zipline-dagster new-model {name}{flags}`.

A {task} model on {table}, its gate ({gate} >= {threshold}), and its scores table
{namespace}.{name}_scores (day ds scored by the newest partition at or before ds-1 passing
its gates) monitored against the day's {label} (realized {realized}).

Its trainer is trainers/{name}/ (a copy of the reference {task} trainer). After editing
it, build it again (`zipline-dagster build-trainer trainers/{name} --model-name {name}
--base BASE`): that records its new version in trainers.lock, which this file reads.
"""

from zipline_dagster import (
    DeploymentSpec,
    EventSource,
    InferenceSpec,
    Metric,
    Model,
    ModelBackend,
    ModelTransforms,
    Query,
    ResourceConfig,
    RolloutStrategy,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)
from zipline_dagster.jobs.pins import pinned_runtime, pinned_version
from zipline_dagster.settings import artifact_base_uri

#: The columns of {table} the trainer reads (besides its label, {label}).
FEATURES = {features}

{name} = Model(
    version=pinned_version("{name}", near=__file__),
    runtime_version=pinned_runtime(near=__file__),
    model_artifact_base_uri=artifact_base_uri(),
    inference_spec=InferenceSpec(
        model_backend=ModelBackend.RAY,
        model_backend_params={{"model_name": "{name}", "model_type": "custom"}},
    ),
    training_conf=TrainingSpec(
        training_data_source=EventSource(
            table="{table}",
            query=Query(selects=selects(*FEATURES, "{label}"), start_partition="2026-07-01"),
        ),
        training_data_window=Window(length={window}, time_unit=TimeUnit.DAYS),
        python_module="trainer.train",
        resource_config=ResourceConfig(min_replica_count=0),
        job_configs={{"features": ",".join(FEATURES), "label-column": "{label}", "eval-days": "1"}},
    ),
    task="{task}",
    deployment_conf=DeploymentSpec(
        rollout_strategy=RolloutStrategy(
            rollout_metric_thresholds=[Metric(name="{gate}", threshold={threshold})],
            regression_tolerance=0.02,
        )
    ),
)

# Day ds of {table} scored by the newest partition at or before ds-1 passing its gates,
# and monitored against the day's {label}.
{name}_scores = ModelTransforms(
    sources=[EventSource(table="{table}")],
    models=[{name}],
    passthrough_fields={keys},
    output_namespace="{namespace}",
    labels=EventSource(table="{table}"),
    label_column="{label}",
    label_keys={keys},
)
'''


class ScaffoldError(RuntimeError):
    """``new-model`` cannot write the model; nothing was written. The message says why."""


@dataclass(frozen=True)
class Written:
    """What ``Scaffold.write`` wrote: the trainer folder (copied from ``template``), the
    lock that pins it, and the code location's definitions loaded with the model."""

    trainer: Path
    template: Path
    lock: Path
    defs: object


@dataclass(frozen=True)
class Scaffold:
    """A new model's declaration: ``new-model``'s flags, the task's defaults filled in."""

    name: str
    table: str
    task: Task
    window: int
    features: tuple[str, ...]
    label: str
    keys: tuple[str, ...]
    threshold: float

    @classmethod
    def of(
        cls,
        name: str,
        *,
        table: str,
        task: str,
        window: int,
        features: str | None,
        label: str | None,
        keys: str,
        threshold: float | None,
    ) -> Scaffold:
        """``new-model``'s flags, the task's defaults where a flag is not given.

        Raises:
            ScaffoldError: they cannot make a model (``problem``).
        """
        t = Task(task)
        made = cls(
            name=name,
            table=table,
            task=t,
            window=window,
            features=tuple(f for f in (features or DEFAULT_FEATURES[t]).split(",") if f),
            label=label or DEFAULT_LABELS[t],
            keys=tuple(k for k in keys.split(",") if k),
            threshold=GATES[t][1] if threshold is None else threshold,
        )
        if (problem := made.problem()) is not None:
            raise ScaffoldError(f"new-model {name!r}: {problem}; nothing was written")
        return made

    def write(
        self, defs_file: Path, module: str, *, template: str | None, load: Callable[[], object]
    ) -> Written:
        """Copy the task's reference trainer to ``trainers/{name}``, pin it and write
        ``defs_file``, then import it and ``load`` the code location ``module`` with it;
        when any of that fails, put everything back as it was.

        Raises:
            ScaffoldError: a file is there already, the template is not a trainer, or the
                code location does not load with the model (nothing is left written).
        """
        from zipline_dagster.jobs.archive import build_trainer_archive
        from zipline_dagster.jobs.pins import TRAINERS_DIR, find_lock, record_pin, write_lock

        lock = find_lock(defs_file)
        source = lock.parent / TRAINERS_DIR / (template or self.template)
        trainer = lock.parent / TRAINERS_DIR / self.name
        for path in (trainer, defs_file):
            if path.exists():
                raise ScaffoldError(
                    f"new-model {self.name!r}: {path} already exists; nothing was written"
                )
        if not (source / "setup.py").is_file():
            raise ScaffoldError(f"new-model: the template trainer {source} has no setup.py")
        lock_before = lock.read_text() if lock.is_file() else None
        try:
            shutil.copytree(source, trainer, ignore=shutil.ignore_patterns("__pycache__"))
            setup = trainer / "setup.py"
            named = re.sub(r'name="[^"]*"', f'name="{self.name}"', setup.read_text(), count=1)
            setup.write_text(named)
            record_pin(lock, self.name, build_trainer_archive(trainer), trainer)
            flags = f" --task {self.task}" if self.task is not Task.CLASSIFICATION else ""
            defs_file.write_text(self.render(flags))
            # the declaration, then the code location with it: a bad --table, --features,
            # --label, --keys, --window or --threshold is refused now, nothing left behind
            importlib.import_module(f"{module}.{self.name}")
            defs = load()
        except BaseException as exc:
            shutil.rmtree(trainer, ignore_errors=True)
            defs_file.unlink(missing_ok=True)
            if lock_before is None:
                lock.unlink(missing_ok=True)
            else:
                write_lock(lock, lock_before)
            if not isinstance(exc, Exception):
                raise
            raise ScaffoldError(
                f"new-model {self.name!r}: the code location {module} does not load with it "
                "(--table, --features, --label, --keys, --window and --threshold are its "
                f"declaration's), so nothing was written: {type(exc).__name__}: {exc}"
            ) from exc
        return Written(trainer, source, lock, defs)

    @property
    def gate(self) -> str:
        return GATES[self.task][0]

    @property
    def template(self) -> str:
        return TEMPLATES[self.task]

    def problem(self) -> str | None:
        """Why these flags cannot make a model (None when they can)."""
        if self.label in self.features:
            return f"--label={self.label} is also among --features; a model does not read its label"
        if not self.features:
            return "--features is empty; name the columns the trainer reads"
        if not self.keys:
            return "--keys is empty; name the columns a scored row is joined to its label on"
        return None

    def render(self, flags: str = "") -> str:
        from zipline_dagster.declarations.tasks import REALIZED_METRICS

        return MODEL_TEMPLATE.format(
            name=self.name,
            flags=flags,
            task=str(self.task),
            table=self.table,
            namespace=self.table.split(".")[0],
            features=_literal(tuple(self.features), indent="", prefix="FEATURES = "),
            label=self.label,
            keys=_literal(list(self.keys), indent="    ", prefix="passthrough_fields="),
            window=self.window,
            gate=self.gate,
            threshold=self.threshold,
            realized=", ".join(REALIZED_METRICS[self.task]),
        )


def _literal(items: tuple[str, ...] | list[str], *, indent: str, prefix: str) -> str:
    """``items`` as the project's formatter writes them (double quotes; one item a line
    with a trailing comma when the line would pass 100 characters), so a scaffolded file
    passes ``make lint`` as written."""
    open_, close = ("(", ")") if isinstance(items, tuple) else ("[", "]")
    quoted = [json.dumps(i) for i in items]
    single = ",".join(quoted[:1]) if isinstance(items, tuple) and len(items) == 1 else None
    inline = f"{open_}{single},{close}" if single else f"{open_}{', '.join(quoted)}{close}"
    if len(indent + prefix + inline) + 1 <= 100:
        return inline
    lines = "".join(f"{indent}    {q},\n" for q in quoted)
    return f"{open_}\n{lines}{indent}{close}"
