"""A range run re-executed from its failure trains only what the failed run left undone.

When a run that trained a range of model partitions failed for some of them, the
partitions it did train were promoted and materialized. Re-executing that run from its
failure (the UI's "Re-execute from failure", the run retry daemon) runs the range's step
again; the partitions the failed run trained are not trained a second time when Dagster
and storage both still say they are the current, fresh model: their materialization is
recorded again with the earlier metadata (and ``reused_from_run``), so the run's checks
see every partition of the range.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from zipline_dagster.declarations.versions import model_code_version
from zipline_dagster.jobs.request import (
    TrainingJob,
)
from zipline_dagster.lineage.freshness import FreshnessResolver
from zipline_dagster.lineage.internals import ASSET_RESUME_RETRY_TAG, RESUME_RETRY_TAG
from zipline_dagster.lineage.ledger import CODE_VERSION_TAG
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import TableDay


def earlier_attempt_runs(context: dg.AssetExecutionContext) -> set[str]:
    """The runs whose work this step's run resumes: the runs it re-executes from their
    failure (parent, grandparent ...). Empty for a first run, and for a re-execution of
    every step (which trains again)."""
    run = context.run
    runs: set[str] = set()
    # what Dagster's re-execution from (asset) failure tags its run with (the UI, the run
    # retry daemon)
    if "true" in (run.tags.get(RESUME_RETRY_TAG), run.tags.get(ASSET_RESUME_RETRY_TAG)):
        parent_id = run.parent_run_id
        while parent_id and parent_id not in runs:
            runs.add(parent_id)
            parent = context.instance.get_run_by_id(parent_id)
            parent_id = parent.parent_run_id if parent is not None else None
    return runs


def why_input_changed(
    store: BlobStore, request: TrainingJob, scan: dict[str, TableDay]
) -> str | None:
    """Why the partition's model on storage cannot stand for its window as committed now
    (``scan``: the training table's commits): a window day committed after the model was
    (a write Dagster was never told of, when the table is outside the run's graph), or a
    commit without a time. None: the model is newer than every day it read."""
    model = model_partition(store, request.canonical_dir, request.ds).commit()
    if model is None or model.at is None:
        return f"its manifest in {request.canonical_dir} is not complete or has no commit time"
    table = request.model.table
    for day in request.days:
        held = scan.get(day)
        at = held.at if held is not None else None
        if not isinstance(at, (int, float)):
            return f"its input {table} {day} has no commit time"
        if at > model.at:
            return f"its input {table} {day} was written after it was trained"
    return None


def reusable_partitions(
    context: dg.AssetExecutionContext,
    requests: list[TrainingJob],
    warehouse: WarehouseResource,
    scan: dict[str, TableDay],
) -> dict[str, dict[str, Any]]:
    """{ds: its earlier materialization's metadata} for the partitions of ``requests`` a
    run this one resumes (``earlier_attempt_runs``) trained and materialized, when
    that is still the partition's latest materialization, of this trainer version, fresh
    (``FreshnessResolver.status``: the ledger's rule applied to it and to what it reads,
    so storage holds exactly that model and nothing upstream was updated since), and
    trained after each window day was committed (``why_input_changed``; ``scan``: the
    training table's commits). The others train."""
    runs = earlier_attempt_runs(context)
    if not runs or not requests:
        return {}
    key = context.asset_key
    # the run's job's graph: the asset, its checks and what it reads
    resolver = FreshnessResolver(
        context.instance,
        context.job_def.asset_layer.asset_graph,
        store=warehouse.store,
        tables=warehouse.tables(),
    )
    latest = resolver.latest_ids(key)
    wanted = {latest[r.ds]: r for r in requests if r.ds in latest}
    if not wanted:
        return {}
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, storage_ids=list(wanted)), limit=len(wanted)
    ).records
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        request, mat = wanted[record.storage_id], record.asset_materialization
        if mat is None or record.run_id not in runs:
            continue
        model = request.model
        if (mat.tags or {}).get(CODE_VERSION_TAG) != model_code_version(model):
            continue
        status = resolver.status(key, request.ds)
        attempt = mat.metadata.get("attempt")
        if not status.fresh:
            why: str | None = str(status)
        elif attempt is None:
            why = "its materialization names no attempt"
        else:
            why = why_input_changed(warehouse.store(request.canonical_dir), request, scan)
        if why is not None:
            context.log.info(
                f"{request.ds} trains again although run {record.run_id} trained it: {why}"
            )
            continue
        out[request.ds] = {**mat.metadata, "reused_from_run": record.run_id}
    if out:
        context.log.info(
            f"{len(out)} of {len(requests)} partitions were trained by the run this one "
            f"re-executes and are unchanged since: not trained again ({', '.join(sorted(out))})"
        )
    return out
