"""A scores day as a job and a commit: the request that runs the inference module of the
partition that scores the day (``Chosen``), from that partition's own trainer archive, and
the commit of the file it staged into the scores table (or a challenger's, beside it), one
Iceberg commit a day. ``scoring.assets`` chooses the partition; ``scoring.shadow`` runs
the challenger's days.
"""

import datetime as dt
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg
from zipline_runtime.contract import ScoringInvocation, TableRead

from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith
from zipline_dagster.declarations.versions import scores_code_version
from zipline_dagster.jobs.ranges import Ran
from zipline_dagster.jobs.request import JobRequest, ScoringJob
from zipline_dagster.lineage.partitions import SCORED_BY
from zipline_dagster.scoring.drift import drift_from_file, drift_metadata
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.metadata import column_schema, day_metadata
from zipline_dagster.storage.paths import archive_uri, join_uri, table_uri
from zipline_dagster.storage.table_days import TableDay
from zipline_dagster.storage.tables import DaysReplaced, Tables


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
    table: str | None = None,
) -> ScoringJob:
    """Day ``ds``'s job: the inference module of the ``model`` partition's trainer version
    on the source's day with that partition, its output file (for ``table``, default the
    scores table) named by the attempt (``--write-id``)."""
    table = table or transforms.table
    invocation = ScoringInvocation(
        read=source or TableRead(transforms.source.table),
        ds=ds,
        model_dir=model.uri,
        output_table=table,
        warehouse=warehouse,
        passthrough=tuple(transforms.passthrough_fields),
        batch_rows=transforms.batch_rows,
    )  # its --write-id is named after the attempt by the launcher
    return ScoringJob(
        model=transforms.model,
        ds=ds,
        warehouse=warehouse,
        days=(ds,),
        model_dir=model.uri,
        archive_uri=archive_uri(
            transforms.model.model_artifact_base_uri, transforms.model.name, model.version
        ),
        version=model.version,
        flags=tuple(invocation.to_flags()),
        module=transforms.inference_module,
        job_key=f"{key_prefix(table)}-{model.version}-{model.ds}-{ds}",
        marker_dir=jobs_dir(warehouse, table, ds),
    )


def jobs_dir(warehouse: str, table: str, ds: str) -> str:
    """Where a scores day's job leaves its end marker (``_attempts/``): beside the
    Iceberg table's data and metadata, removed when the day commits."""
    return join_uri(table_uri(warehouse, table), "_jobs", f"ds={ds}")


def key_prefix(table: str) -> str:
    """The job keys' prefix of a day of scores ``table``."""
    return f"score-{table.replace('.', '-')}"


def commit_day(
    transforms: ModelTransforms,
    request: JobRequest,
    chosen: Chosen,
    tables: Tables,
    ran: Ran,
    *,
    run_id: str,
    warn: Callable[[str], None],
    table: str | None = None,
) -> dict[str, Any]:
    """Commit the files the day's job staged (named by its id) into the scores table, in one
    Iceberg commit, with
    the step's ``tables`` (one catalog for the step's days); its metadata. The job's end
    markers go with the commit; ``warn`` is told when they cannot. ``table``: the table
    the job wrote (default the scores table; a challenger's, the table beside).

    Raises:
        dg.Failure: the run wrote no file, or one that cannot be read, or the commit
            failed (named); the day is left as it was.
    """
    import numpy as np

    ds, job_id = request.ds, ran.job_id
    table = table or transforms.table
    folder = join_uri(tables.staging_uri(table, job_id), f"_ds={ds}")
    store = tables.store
    written = [u for u in store.list(folder) if u.endswith(".parquet")]
    if not written:
        raise dg.Failure(
            f"the scoring job {job_id} succeeded but wrote no parquet file under {folder}; "
            f"{table} {ds} is left as it was"
        )
    scores, drift = _read_staged(table, ds, job_id, store, written)
    rows = len(scores)
    try:
        day: TableDay = tables.commit(
            table,
            {ds: written},
            write_id=job_id,
            run_id=run_id,
            code_version=scores_code_version(transforms),
        )[ds]
    except DaysReplaced as exc:  # another run scored the day at once, and committed after
        raise dg.Failure(str(exc)) from exc
    except (BlobStorageError, WarehouseError, OSError) as exc:
        raise dg.Failure(
            f"{table} {ds}: committing {len(written)} files under {folder} failed ({exc}); "
            "readers see the "
            "old scores or the new ones, never a mix (one Iceberg commit)"
        ) from exc
    try:  # the job's end marker went with the commit
        for uri in store.list(request.marker_dir):
            store.delete(uri)
    except (BlobStorageError, OSError) as exc:
        warn(f"{table} {ds}: the job's markers in {request.marker_dir} stay ({exc})")
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
        **day_metadata(day, column_schema(tables, table)),
    }
    values = scores  # a null is NaN here
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


def _read_staged(
    table: str, ds: str, job_id: str, store: Any, written: list[str]
) -> tuple[Any, dict[str, Any]]:
    """The scores of a day's staged files (their score column only: the summary needs
    nothing else), and the drift the last one carries.

    Raises:
        dg.Failure: a file cannot be read, or has no score column (this day fails alone).
    """
    import numpy as np
    import pyarrow.parquet as pq

    parts: list[Any] = []
    drift: dict[str, Any] = {}
    for uri in written:
        try:
            staged = pq.read_table(io.BytesIO(store.read_bytes(uri)), columns=["score"])
        except Exception as exc:  # unreadable, no score column, storage
            raise dg.Failure(
                f"{table} {ds}: the scoring job {job_id} wrote {uri}, which cannot "
                f"be read ({type(exc).__name__}: {exc}); the partition is left as it was"
            ) from exc
        parts.append(staged["score"].to_numpy().astype("float64", copy=False))
        drift = drift_from_file(staged.schema.metadata) or drift
    return (np.concatenate(parts) if parts else np.array([])), drift
