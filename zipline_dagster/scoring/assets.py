"""The scores table of a ``ModelTransforms``: a daily asset whose partition ``ds`` is one
Ray Job (the model's inference module, from the same trainer archive); a backfill run's
range of days is one Ray Job too, one task per day (``jobs.ranges``, as model
partitions run).

Partition ``ds`` depends on the source table's partition ``ds`` and on the model
partition ``ds-1`` (or the champion), so retraining that model partition makes exactly
the scores it served stale. By default the day is scored by the newest model partition at
or before ``ds-1`` whose blocking gates pass (``ScoreWith``, ``ModelChoice``). The job
stages one file per day named by its attempt; the step commits a day into the Iceberg
scores table (one commit) only when that day's run succeeded, so readers see the old
scores or the new ones, never a mix.
"""

import datetime as dt
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith
from zipline_dagster.declarations.versions import scores_code_version
from zipline_dagster.errors import failure
from zipline_dagster.jobs.ranges import Ran, run_days
from zipline_dagster.jobs.request import (
    JobRequest,
    TableRead,
)
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.lineage.ledger import Ledger, prefixed
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
    SCORED_BY,
    champion_asset_key,
    daily_partitions,
    model_asset_key,
    starting_at,
    table_asset_key,
    trainable_partitions,
)
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import gates as g
from zipline_dagster.rollout.assets import gate_judge
from zipline_dagster.scoring.drift import drift_from_file, drift_metadata
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.commits import Commit
from zipline_dagster.storage.days import shift_day
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.metadata import column_schema, day_metadata
from zipline_dagster.storage.paths import (
    join_uri,
    model_archive_uri,
    model_partition_uri,
    table_uri,
)
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import TableDay, window_snapshot
from zipline_dagster.storage.tables import DaysReplaced, Tables


def scoring_partitions(transforms: ModelTransforms) -> dg.TimeWindowPartitionsDefinition:
    """From the day after the model's first trainable partition (day ds needs model ds-1)."""
    model_parts = trainable_partitions(transforms.model, daily_partitions)
    assert isinstance(model_parts, dg.TimeWindowPartitionsDefinition)
    return starting_at(model_parts, (model_parts.start.date() + dt.timedelta(days=1)).isoformat())


class ScoringError(RuntimeError):
    """What scoring a day needs is not there; the message names it."""


@dataclass(frozen=True)
class Chosen:
    """The model partition that scores a day, and why that one."""

    uri: str
    version: str
    ds: str
    why: str


def scoring_request(
    transforms: ModelTransforms,
    ds: str,
    *,
    warehouse: str,
    model: Chosen,
    source: TableRead | None = None,
) -> JobRequest:
    """Day ``ds``'s job: the inference module on the source's day with the ``model``
    partition, its output file named by the attempt (``--write-id``)."""
    flags = (
        f"--input-table={transforms.source.table}",
        f"--ds={ds}",
        f"--model-dir={model.uri}",
        f"--output-table={transforms.table}",
        f"--warehouse={warehouse}",
        "--write-id=pending",  # the launcher names it after the attempt
        f"--passthrough={','.join(transforms.passthrough_fields)}",
        *(f"--{k}={v}" for k, v in (source.flags() if source else {}).items()),
    )
    return JobRequest(
        model=transforms.model,
        ds=ds,
        warehouse=warehouse,
        days=(ds,),
        model_dir=model.uri,
        archive_uri=model_archive_uri(transforms.model),
        flags=flags,
        module=transforms.inference_module,
        attempt_flag="write-id",
        job_key_override=f"{_key_prefix(transforms)}-{model.version}-{model.ds}-{ds}",
        marker_dir=jobs_dir(warehouse, transforms.table, ds),
    )


def jobs_dir(warehouse: str, table: str, ds: str) -> str:
    """Where a scores day's job leaves its end marker (``_attempts/``): beside the
    Iceberg table's data and metadata, removed when the day commits."""
    return join_uri(table_uri(warehouse, table), "_jobs", f"ds={ds}")


def _key_prefix(transforms: ModelTransforms) -> str:
    return f"score-{transforms.table.replace('.', '-')}"


class ModelChoice:
    """Which model partition scores each day of a run (``ModelTransforms.score_with``),
    each partition's gates judged at most once per run and the trained partitions listed
    at most once."""

    def __init__(
        self,
        transforms: ModelTransforms,
        warehouse: WarehouseResource,
        instance: dg.DagsterInstance | None = None,
        warn: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.transforms = transforms
        self.model = transforms.model
        self.store = warehouse.store(self.model.model_artifact_base_uri)
        self.ledger = (
            Ledger(instance, judge=gate_judge(self.model, store=warehouse.store))
            if instance
            else None
        )
        #: told what the run should know (a model partition recorded from storage)
        self.warn = warn
        self._trained: list[str] | None = None
        self._verdicts: dict[str, dict[str, g.GateResult]] = {}

    def _failed(self, model_ds: str) -> list[g.GateResult]:
        if model_ds not in self._verdicts:
            self._verdicts[model_ds] = g.evaluate(self.model, self.store, model_ds)
        return [r for r in self._verdicts[model_ds].values() if not r.passed]

    def _older(self, model_ds: str) -> list[str]:
        """The trained partitions before ``model_ds``, newest first."""
        if self._trained is None:
            self._trained = cp.trained_partitions(self.store, self.model)
        return [d for d in reversed(self._trained) if d < model_ds]

    def resolve(self, ds: str) -> Chosen:
        """The model partition that scores day ``ds``. With the run's
        ``instance``, the model partition on storage must be the one Dagster recorded.

        Raises:
            ScoringError: no partition qualifies; the message names why.
        """
        transforms, model, store = self.transforms, self.model, self.store
        if transforms.score_with is ScoreWith.CHAMPION:
            return self._champion(ds)
        model_ds = shift_day(ds, -1)
        model_dir = model_partition_uri(model, model_ds)
        held = model_partition(store, model_dir, model_ds)
        if not held.committed:
            raise ScoringError(
                f"{transforms.table} {ds} is scored by {model.name} partition {model_ds} "
                f"(trained on data before {ds}), which is not trained: no finished model at "
                f"{model_dir}. Materialize models/{model.name} partition {model_ds} first."
            )
        chosen, why = model_ds, f"partition {model_ds} (the day before)"
        if transforms.score_with is ScoreWith.DAY_BEFORE:
            why += ", whatever its gates said (declared score_with='day_before', for evaluation)"
        elif failed := self._failed(model_ds):
            chosen, why = self._newest_passing(ds, model_ds, failed)
        chosen_dir = model_partition_uri(model, chosen)
        if chosen != model_ds:  # an older partition: its own manifest
            held = model_partition(store, chosen_dir, chosen)
        self._check_recorded(ds, chosen, held.commit())
        return Chosen(chosen_dir, model.version, chosen, why)

    def _newest_passing(
        self, ds: str, model_ds: str, failed: list[g.GateResult]
    ) -> tuple[str, str]:
        model = self.model
        gates = "; ".join(f"{r.gate}: {r.summary}" for r in failed)
        older = self._older(model_ds)
        for d in older:
            if not self._failed(d):
                return d, (
                    f"partition {d}, the newest at or before {model_ds} passing its blocking "
                    f"gates ({model_ds} fails {gates})"
                )
        raise ScoringError(
            f"{self.transforms.table} {ds}: no partition of {model.name} {model.version} at "
            f"or before {model_ds} passes its blocking gates, so none scores it: {model_ds} "
            f"fails {gates}"
            + (f"; the {len(older)} older trained partition(s) fail too" if older else "")
            + ". Train a partition that passes, or declare score_with='day_before' to score "
            "with the day before whatever its gates say (for evaluation)."
        )

    def _check_recorded(self, ds: str, model_ds: str, commit: Commit | None) -> None:
        """The ledger's rule for the model partition that scores ``ds`` (its ``commit``,
        as just read): storage's model is recorded into Dagster when its run ended without
        recording it; one a run is still writing is refused."""
        if self.ledger is None:
            return
        model = self.model
        why = self.ledger.admit(
            model_asset_key(model.name),
            model_ds,
            commit,
            prefixed(self.warn, f"{model.name} partition {model_ds}"),
        )
        if why:
            raise ScoringError(
                f"{self.transforms.table} {ds} is scored by {model.name} partition {model_ds}, "
                f"but {why}: score it once that run has ended"
            )

    def _champion(self, ds: str) -> Chosen:
        transforms, model, store = self.transforms, self.model, self.store
        pointer = cp.read_champion(store, model)
        if pointer is None:
            raise ScoringError(
                f"{transforms.table} {ds}: scored by the champion of {model.name}, which has "
                f"none yet ({cp.champion_uri(model)} is absent)"
            )
        retrained = ch.why_pinned_attempt_gone(store, pointer)
        if retrained:
            raise ScoringError(
                f"{transforms.table} {ds} is scored by the champion of {model.name}, but "
                f"{retrained}. Move the champion again (materialize "
                f"{champion_asset_key(model.name).to_user_string()}, or `zipline-dagster promote "
                f"{model.name} --ds {pointer.ds}`) so that what serves has passed the gates"
            )
        return Chosen(
            pointer.artifact_uri, pointer.version, pointer.ds, f"champion {pointer.where}"
        )


class ScoringWork:
    """Scores days for ``run_days``: each day's model chosen (``ModelChoice``) and its
    source day checked (the source table listed once per step); the file a day's job
    wrote committed as the day's only file."""

    verb, doing, runner, together = "scored", "scoring", "inference module", True

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        transforms: ModelTransforms,
        warehouse: WarehouseResource,
    ) -> None:
        self.context, self.transforms, self.warehouse = context, transforms, warehouse
        self.model, self.name = transforms.model, transforms.table
        self.key_prefix = _key_prefix(transforms)
        self.choice = ModelChoice(transforms, warehouse, context.instance, context.log.warning)
        self.chosen: dict[str, Chosen] = {}
        self.tables = warehouse.tables()
        try:
            self.metadata, self.have = self.tables.state(
                transforms.source.table, only=list(context.partition_keys)
            )
        except (BlobStorageError, WarehouseError) as exc:
            raise failure(exc) from exc

    def prepare(self, ds: str) -> JobRequest:
        source = self.transforms.source.table
        try:
            chosen = self.choice.resolve(ds)
            if ds not in self.have:
                raise ScoringError(
                    f"{self.transforms.table} {ds}: source {source} partition {ds} is missing "
                    "(not committed); materialize it first"
                )
        except (ScoringError, BlobStorageError) as exc:
            raise failure(exc) from exc
        self.chosen[ds] = chosen
        self.context.log.info(f"{ds}: scoring {source} with {self.model.name} {chosen.why}")
        source_read = TableRead(self.metadata or "", window_snapshot(self.have, [ds]))
        return scoring_request(
            self.transforms, ds, warehouse=self.warehouse.uri, model=chosen, source=source_read
        )

    def reuse(self, ready: list[JobRequest]) -> dict[str, dict[str, Any]]:
        return {}

    def begin(self, request: JobRequest) -> None:
        pass

    def finish(self, request: JobRequest, ran: Ran) -> dict[str, Any]:
        return commit_day(
            self.transforms,
            request,
            self.chosen[request.ds],
            self.tables,
            ran,
            run_id=self.context.run.run_id,
            warn=self.context.log.warning,
        )


def commit_day(
    transforms: ModelTransforms,
    request: JobRequest,
    chosen: Chosen,
    tables: Tables,
    ran: Ran,
    *,
    run_id: str,
    warn: Callable[[str], None],
) -> dict[str, Any]:
    """Commit the file the day's job staged (named by its id) into the scores table, with
    the step's ``tables`` (one catalog for the step's days); its metadata. The job's end
    markers go with the commit; ``warn`` is told when they cannot.

    Raises:
        dg.Failure: the run wrote no file, or one that cannot be read, or the commit
            failed (named); the day is left as it was.
    """
    import numpy as np
    import pyarrow.parquet as pq

    ds, job_id = request.ds, ran.job_id
    written = join_uri(
        tables.staging_uri(transforms.table, job_id), f"_ds={ds}", "part-00000.parquet"
    )
    store = tables.store
    if not store.exists(written):
        raise dg.Failure(
            f"the scoring job {job_id} succeeded but wrote no {written}; "
            f"{transforms.table} {ds} is left as it was"
        )
    try:
        # the score column only: the summary needs nothing else
        staged = pq.read_table(io.BytesIO(store.read_bytes(written)), columns=["score"])
        scores, drift = staged["score"], drift_from_file(staged.schema.metadata)
    except Exception as exc:  # unreadable, no score column, storage: this day fails alone
        raise dg.Failure(
            f"{transforms.table} {ds}: the scoring job {job_id} wrote {written}, which cannot "
            f"be read ({type(exc).__name__}: {exc}); the partition is left as it was"
        ) from exc
    rows = len(scores)
    try:
        day: TableDay = tables.commit(
            transforms.table,
            {ds: [written]},
            write_id=job_id,
            run_id=run_id,
            code_version=scores_code_version(transforms),
        )[ds]
    except DaysReplaced as exc:  # another run scored the day at once, and committed after
        raise dg.Failure(str(exc)) from exc
    except (BlobStorageError, WarehouseError, OSError) as exc:
        raise dg.Failure(
            f"{transforms.table} {ds}: committing {written} failed ({exc}); readers see the "
            "old scores or the new ones, never a mix (one Iceberg commit)"
        ) from exc
    try:  # the job's end marker went with the commit
        for uri in store.list(request.marker_dir):
            store.delete(uri)
    except (BlobStorageError, OSError) as exc:
        warn(f"{transforms.table} {ds}: the job's markers in {request.marker_dir} stay ({exc})")
    md: dict[str, Any] = {
        "rows": dg.MetadataValue.int(rows),
        "model_dir": dg.MetadataValue.path(chosen.uri),
        "model_version": dg.MetadataValue.text(chosen.version),
        SCORED_BY: dg.MetadataValue.text(chosen.ds),
        "model_age_days": dg.MetadataValue.int(
            (dt.date.fromisoformat(ds) - dt.date.fromisoformat(chosen.ds)).days
        ),
        "score_with": dg.MetadataValue.text(ScoreWith(transforms.score_with).value),
        "scored_by": dg.MetadataValue.text(chosen.why),
        "job_id": dg.MetadataValue.text(job_id),
        **({"uri": dg.MetadataValue.path(day.files[0])} if day.files else {}),
        **day_metadata(day, column_schema(tables, transforms.table)),
    }
    values = scores.to_numpy().astype("float64", copy=False)  # a null is NaN here
    values = values[~np.isnan(values)]
    if len(values):
        md["score_mean"] = dg.MetadataValue.float(float(values.mean()))
        md["score_p50"] = dg.MetadataValue.float(float(np.median(values)))
    if ran.url:
        md["ray_job"] = dg.MetadataValue.url(ran.url)
    if ran.span:
        md["range"] = dg.MetadataValue.text(ran.span)
    if ran.cost is not None:
        md.update(ran.cost.metadata(rows))
    md.update(drift_metadata(drift))
    return md


def build_scores_asset(
    transforms: ModelTransforms, *, automation_condition: dg.AutomationCondition | None = None
) -> dg.AssetsDefinition:
    model = transforms.model
    deps = [
        dg.AssetDep(
            table_asset_key(transforms.source.table),
            partition_mapping=dg.TimeWindowPartitionMapping(start_offset=0, end_offset=0),
        ),
        dg.AssetDep(champion_asset_key(model.name))
        if transforms.use_champion
        else dg.AssetDep(
            model_asset_key(model.name),
            partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1),
        ),
    ]

    @dg.asset(
        key=table_asset_key(transforms.table),
        group_name="scores",
        partitions_def=scoring_partitions(transforms),
        deps=deps,
        # A backfill hands a run up to this many days; on Ray they score together in one
        # job (``score_range``), each still its own materialization and commit.
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=PARTITIONS_PER_RUN),
        kinds={"ray", "parquet"},
        code_version=scores_code_version(transforms),
        automation_condition=automation_condition,
        description=(
            f"{transforms.source.table} rows of day ds scored by {model.name} "
            + {
                ScoreWith.CHAMPION: "(its champion)",
                ScoreWith.DAY_BEFORE: "partition ds-1 whatever its gates said (evaluation)",
                ScoreWith.NEWEST_PASSING: "the newest partition at or before ds-1 passing its "
                "blocking gates",
            }[ScoreWith(transforms.score_with)]
            + f" with {transforms.inference_module}; passthrough "
            + (", ".join(transforms.passthrough_fields) or "none")
            + "."
        ),
        metadata={"zipline/table": transforms.table, "zipline/model_name": model.name},
        op_tags={"zipline/model": model.name},
    )
    def _scores(
        context: dg.AssetExecutionContext,
        launcher: JobLauncher,
        warehouse: WarehouseResource,
    ) -> dg.MaterializeResult:
        work = ScoringWork(context, transforms, warehouse)
        return run_days(context, work, list(context.partition_keys), launcher, warehouse)

    return _scores
