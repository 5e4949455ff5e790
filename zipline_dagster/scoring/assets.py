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
from collections.abc import Callable
from typing import Any

import dagster as dg
from zipline_runtime.contract import TableRead

from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith
from zipline_dagster.declarations.versions import scores_code_version
from zipline_dagster.errors import failure
from zipline_dagster.jobs.ranges import Ran, run_days
from zipline_dagster.jobs.request import (
    JobRequest,
)
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.lineage.ledger import Ledger, prefixed
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
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
from zipline_dagster.scoring.days import Chosen, commit_day, key_prefix, scoring_request
from zipline_dagster.scoring.shadow import score_challenger
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.commits import Commit
from zipline_dagster.storage.days import shift_day
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.paths import (
    model_partition_uri,
)
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import window_snapshot


def scoring_partitions(transforms: ModelTransforms) -> dg.TimeWindowPartitionsDefinition:
    """From the day after the model's first trainable partition (day ds needs model ds-1)."""
    model_parts = trainable_partitions(transforms.model, daily_partitions)
    assert isinstance(model_parts, dg.TimeWindowPartitionsDefinition)
    return starting_at(model_parts, (model_parts.start.date() + dt.timedelta(days=1)).isoformat())


class ScoringError(RuntimeError):
    """What scoring a day needs is not there; the message names it."""


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

    def challenger(self, days: list[str]) -> tuple[cp.Challenger | None, list[str]]:
        """The challenger that shadows the model's champion now (``RolloutStrategy(kind=
        "shadow")``) and which of ``days`` it scores beside it (those after its partition);
        (None, []) when none does.

        Raises:
            BlobStorageError: the champion pointer cannot be read.
        """
        if not self.model.rollout.shadow:
            return None, []
        pointer = cp.read_champion(self.store, self.model)
        challenger = pointer.shadowed_by if pointer is not None else None
        if challenger is None:
            return None, []
        return challenger, [ds for ds in days if ds > challenger.ds]

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
        self.key_prefix = key_prefix(transforms.table)
        self.choice = ModelChoice(transforms, warehouse, context.instance, context.log.warning)
        self.chosen: dict[str, Chosen] = {}
        #: what each day's scores carry about the challenger that shadow-scored it
        self.shadow: dict[str, dict[str, Any]] = {}
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
        source_read = TableRead(
            self.transforms.source.table, self.metadata or None, window_snapshot(self.have, [ds])
        )
        return scoring_request(
            self.transforms, ds, warehouse=self.warehouse.uri, model=chosen, source=source_read
        )

    def reuse(self, ready: list[JobRequest]) -> dict[str, dict[str, Any]]:
        return {}

    def begin(self, request: JobRequest) -> None:
        pass

    def finish(self, request: JobRequest, ran: Ran) -> dict[str, Any]:
        md = commit_day(
            self.transforms,
            request,
            self.chosen[request.ds],
            self.tables,
            ran,
            run_id=self.context.run.run_id,
            warn=self.context.log.warning,
        )
        return {**md, **self.shadow.get(request.ds, {})}


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
        kinds={"ray", "iceberg"},
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
        # the challenger's days first: the champion's day then records what it scored
        work.shadow = score_challenger(context, work.choice, launcher, work)
        return run_days(context, work, list(context.partition_keys), launcher, warehouse)

    return _scores
