"""Reproduce a model partition: train it again on the Iceberg snapshot it read.

A partition's manifest records the input table's metadata file and the snapshot the
platform resolved for its window (``input``). ``reproduce`` trains the same archive on
that snapshot into a new attempt folder (``{version}/{ds}/_attempts/{id}``): never
promoted, so the partition, its champion and Dagster's records stay as they are. It
returns each metric beside the recorded one (``zipline-dagster reproduce MODEL DS``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zipline_runtime.contract import TableRead

from zipline_dagster.declarations.model import Model
from zipline_dagster.jobs.ranges import load_archive
from zipline_dagster.jobs.request import build_training_request, traceback_tail
from zipline_dagster.jobs.resources import JobLauncher
from zipline_dagster.storage.artifacts import (
    ArtifactError,
    read_report,
    report_metrics,
)
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.paths import model_partition_uri
from zipline_dagster.storage.resources import WarehouseResource


class ReproduceError(RuntimeError):
    """A partition cannot be reproduced; names the model, the day and why."""


@dataclass(frozen=True)
class Reproduced:
    """A partition trained again at its recorded snapshot."""

    model: str
    ds: str
    snapshot_id: int | None
    attempt_dir: str
    job_id: str
    #: (metric, recorded value, reproduced value), in the report's order
    metrics: tuple[tuple[str, float | None, float | None], ...]

    def lines(self) -> list[str]:
        """What the CLI prints: where it ran, then each metric beside the recorded one."""
        out = [
            f"{self.model} {self.ds}: retrained at snapshot {self.snapshot_id} into "
            f"{self.attempt_dir} (job {self.job_id}; not promoted)",
            f"{'metric':<24} {'recorded':>12} {'reproduced':>12}",
        ]
        for name, was, now in self.metrics:
            out.append(f"{name:<24} {_num(was):>12} {_num(now):>12}")
        return out


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def reproduce(
    model: Model, ds: str, warehouse: WarehouseResource, launcher: JobLauncher
) -> Reproduced:
    """Train ``model`` partition ``ds`` again at the snapshot its manifest records.

    Raises:
        ReproduceError: the partition is not trained, records no snapshot, or the job
            failed (its traceback's tail).
    """
    import dagster as dg

    who = f"model {model.name!r} partition {ds}"
    store = warehouse.store(model.model_artifact_base_uri)
    model_dir = model_partition_uri(model, ds)
    try:
        partition = model_partition(store, model_dir, ds)
        if not partition.committed or partition.manifest is None:
            raise ReproduceError(f"{who} is not trained: no complete manifest in {model_dir}")
        read = partition.manifest.input
        if not read.get("metadata"):
            raise ReproduceError(
                f"{who} records no input snapshot (trained before the warehouse was on "
                "Iceberg); train it again to record one"
            )
        recorded = report_metrics(read_report(store, model_dir))
    except (ArtifactError, BlobStorageError) as exc:
        raise ReproduceError(f"{who}: {exc}") from exc
    table = TableRead.from_json({"table": model.table, **read}, where=f"{who}'s manifest")
    request = build_training_request(model, ds, warehouse=warehouse.uri, table=table)
    try:
        code = load_archive(model, warehouse)
    except dg.Failure as exc:
        raise ReproduceError(f"{who}: {exc.description}") from None
    log = logging.getLogger("zipline_dagster.reproduce")
    outcome = launcher.runner(log, warehouse.store).run(
        request,
        archive=code.archive,
        runtime=code.runtime,
        requirements=code.requirements,
        metadata={"zipline_model": model.name, "zipline_ds": ds, "zipline_reproduce": "true"},
    )
    if outcome.status != "SUCCEEDED":
        raise ReproduceError(
            f"{who}: the job {outcome.job_id} ended {outcome.status}:\n{traceback_tail(outcome.logs)}"
        )
    again = report_metrics(read_report(warehouse.store(outcome.model_dir), outcome.model_dir))
    names = [*recorded, *(k for k in again if k not in recorded)]
    return Reproduced(
        model.name,
        ds,
        table.snapshot_id,
        outcome.model_dir,
        outcome.job_id,
        tuple((k, recorded.get(k), again.get(k)) for k in names),
    )
