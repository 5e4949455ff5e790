"""The ``warehouse_maintenance`` job and schedule: every table the code location writes
keeps its metadata small (``storage.maintenance``), and never loses a snapshot a champion
trained on.

The snapshots a model's champion, current or in its history, read (its manifest's
``input``) are tagged ``champion-{model}-{version}-{ds}`` on its training table before
anything expires, so ``zipline-dagster reproduce`` works for every champion there was.
The schedule runs daily; it is stopped unless ``ZIPLINE_WAREHOUSE_MAINTENANCE=on`` (the
topology turns it on), and the UI can start it.
"""

import datetime as dt
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from zipline_dagster.declarations.model import Model
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStorageError, BlobStore
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.maintenance import maintain
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.paths import model_dir_uri
from zipline_dagster.storage.resources import WarehouseResource

JOB_NAME = "warehouse_maintenance"


def champion_snapshots(store: BlobStore, model: Model) -> dict[str, int]:
    """{tag: snapshot id} of the training table snapshots the model's champions read."""
    pointers = [p for p in [cp.read_champion(store, model), *cp.history(store, model)] if p]
    out: dict[str, int] = {}
    for p in pointers:
        version, ds = p.version, p.ds
        model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, version, ds)
        partition = model_partition(store, model_dir, ds)
        snapshot = (
            partition.manifest.snapshot_id if partition.committed and partition.manifest else None
        )
        if snapshot is not None:
            out[f"champion-{model.name}-{version}-{ds}"] = snapshot
    return out


class MaintenanceConfig(dg.Config):
    retain_days: float = Field(
        default=7.0, description="Snapshots older than this expire (unless a champion's)."
    )


def build_maintenance(
    tables: Sequence[str], models: Sequence[Model], *, running: bool
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The job maintaining ``tables`` and its daily schedule (``running``: started)."""

    @dg.op(name="maintain_tables")
    def _maintain(
        context: dg.OpExecutionContext, config: MaintenanceConfig, warehouse: WarehouseResource
    ) -> None:
        keep: dict[str, dict[str, int]] = {}
        for m in models:
            try:
                tags = champion_snapshots(warehouse.store(m.model_artifact_base_uri), m)
            except BlobStorageError as exc:
                raise dg.Failure(f"champions of {m.name!r} cannot be read: {exc}") from exc
            keep.setdefault(m.table, {}).update(tags)
        catalog = warehouse.tables()
        for table in tables:
            try:
                done = maintain(
                    catalog,
                    table,
                    retain=dt.timedelta(days=config.retain_days),
                    keep=keep.get(table),
                )
            except WarehouseError as exc:
                raise dg.Failure(str(exc)) from exc
            if done is not None:
                context.log.info(done.describe())

    @dg.job(name=JOB_NAME, description="Expire old snapshots and compact manifests of every table.")
    def _job() -> None:
        _maintain()

    schedule = dg.ScheduleDefinition(
        name=JOB_NAME,
        job=_job,
        cron_schedule="17 3 * * *",
        default_status=(
            dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
        ),
    )
    return _job, schedule
