"""Shadow scoring: each scored day of a model whose rollout is ``kind="shadow"`` is scored
by its challenger too, into the table beside the scores (``{scores table}_challenger``,
the same columns), before the champion's scores of the day are committed.

The challenger is the one the champion pointer names (``ChampionPointer.shadowed_by``),
and it scores only days after its own partition (trained on data before them). Its days
run as the champion's do (``jobs.ranges.run_jobs``: one Ray job for a range, from the
challenger's own trainer archive) and commit into the challenger's table, one Iceberg
commit a day. A challenger's day that fails never fails the scores: the champion serves;
the day's metadata says what the challenger missed, and its monitoring has no challenger
numbers for that day.
"""

from __future__ import annotations

from typing import Any, Protocol

import dagster as dg
from zipline_runtime.contract import TableRead

from zipline_dagster.declarations.transforms import ModelTransforms
from zipline_dagster.jobs.ranges import Ran, run_jobs
from zipline_dagster.jobs.request import JobRequest
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.lineage.partitions import SCORED_BY
from zipline_dagster.scoring.days import Chosen, commit_day, key_prefix, scoring_request
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import window_snapshot
from zipline_dagster.storage.tables import SNAPSHOT_ID, Tables


class Choice(Protocol):
    """What shadow scoring asks the run's ``scoring.assets.ModelChoice``."""

    def challenger(self, days: list[str]) -> tuple[cp.Challenger | None, list[str]]: ...


class Scoring(Protocol):
    """What shadow scoring reads of the run's ``scoring.assets.ScoringWork``."""

    transforms: ModelTransforms
    warehouse: WarehouseResource
    tables: Tables
    metadata: str | None
    have: dict[str, Any]


#: the prefix of the challenger's keys in a scored day's and a monitored day's metadata
PREFIX = "challenger/"
#: the metadata keys of a challenger's scores day carried into the day's own
CARRIED = ("rows", "model_version", SCORED_BY, "score_mean", "job_id", SNAPSHOT_ID)


class ChallengerWork:
    """The challenger's scores days, for ``run_jobs`` (a ``jobs.ranges.DayWork``)."""

    verb, doing, runner, together = "shadow-scored", "shadow scoring", "inference module", True

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        transforms: ModelTransforms,
        warehouse: WarehouseResource,
        challenger: cp.Challenger,
        source: tuple[str | None, dict[str, Any]],
        tables: Tables,
    ) -> None:
        self.context, self.transforms, self.warehouse = context, transforms, warehouse
        self.model, self.name = transforms.model, transforms.challenger_table
        self.key_prefix = key_prefix(self.name)
        self.chosen = Chosen(
            challenger.artifact_uri,
            challenger.version,
            challenger.ds,
            f"challenger {challenger.where} (shadow)",
        )
        self.metadata, self.have = source
        self.tables = tables

    def prepare(self, ds: str) -> JobRequest:
        if ds not in self.have:  # the champion's day fails for it, naming it
            raise dg.Failure(f"source {self.transforms.source.table} partition {ds} is missing")
        read = TableRead(
            self.transforms.source.table, self.metadata or None, window_snapshot(self.have, [ds])
        )
        return scoring_request(
            self.transforms,
            ds,
            warehouse=self.warehouse.uri,
            model=self.chosen,
            source=read,
            table=self.name,
        )

    def reuse(self, ready: list[JobRequest]) -> dict[str, dict[str, Any]]:
        return {}

    def begin(self, request: JobRequest) -> None:
        pass

    def finish(self, request: JobRequest, ran: Ran) -> dict[str, Any]:
        md = commit_day(
            self.transforms,
            request,
            self.chosen,
            self.tables,
            ran,
            run_id=self.context.run.run_id,
            warn=self.context.log.warning,
            table=self.name,
        )
        return {PREFIX + k: md[k] for k in CARRIED if k in md}


def score_challenger(
    context: dg.AssetExecutionContext,
    choice: Choice,
    launcher: JobLauncher,
    scoring: Scoring,
) -> dict[str, dict[str, Any]]:
    """Score the run's days with the challenger that shadows the champion (``choice``,
    the run's ``ModelChoice``, says which and which days), with the ``scoring`` step's
    source days and tables; {ds: the metadata the day's scores carry about it}. Never
    raises: what the challenger could not score is named in the day's
    ``challenger/error`` and logged."""
    transforms, warehouse = scoring.transforms, scoring.warehouse
    try:
        challenger, shadowed = choice.challenger(list(context.partition_keys))
    except BlobStorageError as exc:
        context.log.warning(f"{transforms.table}: the champion pointer cannot be read ({exc})")
        return {}
    if challenger is None or not shadowed:
        return {}
    context.log.info(
        f"{transforms.challenger_table}: shadow scoring {', '.join(shadowed)} with the "
        f"challenger {challenger.where}"
    )
    source = (scoring.metadata, scoring.have)
    work = ChallengerWork(context, transforms, warehouse, challenger, source, scoring.tables)
    try:
        done, errors = run_jobs(context, work, shadowed, launcher, warehouse)
    except dg.Failure as exc:  # nothing could run: the champion serves all the same
        errors, done = dict.fromkeys(shadowed, exc), {}
    for ds, error in errors.items():
        why = (error.description or "failed").splitlines()[0]
        context.log.warning(
            f"{transforms.challenger_table} {ds}: the challenger {challenger.where} did not "
            f"score it ({why}); the champion's scores stand"
        )
        done[ds] = {
            PREFIX + "model_version": dg.MetadataValue.text(challenger.version),
            PREFIX + SCORED_BY: dg.MetadataValue.text(challenger.ds),
            PREFIX + "error": dg.MetadataValue.text(why),
        }
    return done
