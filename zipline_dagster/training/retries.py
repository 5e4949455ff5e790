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

from zipline_dagster.lineage.backfill import FreshnessResolver
from zipline_dagster.lineage.internals import ASSET_RESUME_RETRY_TAG, RESUME_RETRY_TAG
from zipline_dagster.lineage.ledger import CODE_VERSION_TAG
from zipline_dagster.storage.artifacts import (
    read_json_object,
)
from zipline_dagster.storage.blobs import BlobStorageError
from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri, table_partition_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import COMMIT_NAME
from zipline_dagster.training.request import (
    TrainingRequest,
)


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


def _json_object(warehouse: WarehouseResource, uri: str) -> dict[str, Any] | None:
    """The JSON object stored at ``uri``; None when it is missing, unreadable or not one."""
    try:
        return read_json_object(warehouse.store(uri), uri)
    except (ValueError, BlobStorageError):
        return None


def why_changed_on_storage(
    warehouse: WarehouseResource, request: TrainingRequest, run_id: str, attempt: str
) -> str | None:
    """Why the partition's finished model on storage is not the one ``run_id`` recorded,
    or was trained on input that has been written again since (None: it is, and it was
    not)."""
    manifest_uri = join_uri(request.canonical_dir, MANIFEST_NAME)
    manifest = _json_object(warehouse, manifest_uri)
    if manifest is None:
        return f"its manifest {manifest_uri} cannot be read"
    if manifest.get("dagster_run_id") != run_id or manifest.get("attempt") != attempt:
        return (
            f"{manifest_uri} now holds attempt {manifest.get('attempt')} of run "
            f"{manifest.get('dagster_run_id')}"
        )
    trained_at = manifest.get("committed_at")
    if not isinstance(trained_at, (int, float)):
        return f"its manifest {manifest_uri} has no commit time"
    for day in request.days:
        marker = join_uri(
            table_partition_uri(request.warehouse, request.model.table, day), COMMIT_NAME
        )
        committed = (_json_object(warehouse, marker) or {}).get("committed_at")
        if not isinstance(committed, (int, float)):
            return f"its input {request.model.table} {day} has no commit time ({marker})"
        if committed > trained_at:
            return f"its input {request.model.table} {day} was written after it was trained"
    return None


def reusable_partitions(
    context: dg.AssetExecutionContext,
    requests: list[TrainingRequest],
    warehouse: WarehouseResource,
) -> dict[str, dict[str, Any]]:
    """{ds: its earlier materialization's metadata} for the partitions of ``requests`` a
    run this one resumes (``earlier_attempt_runs``) trained and materialized, when
    that is still the partition's latest materialization, of this trainer version, fresh
    (``FreshnessResolver``: upstream not updated since), and storage holds exactly that
    model, trained after its input was written. The others train."""
    runs = earlier_attempt_runs(context)
    if not runs or not requests:
        return {}
    key = context.asset_key
    # the run's job's graph: the asset, its checks and what it reads
    resolver = FreshnessResolver(context.instance, context.job_def.asset_layer.asset_graph)
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
        if (mat.tags or {}).get(CODE_VERSION_TAG) != model.version:
            continue
        status = resolver.status(key, request.ds)
        attempt = mat.metadata.get("attempt")
        if status != "fresh":
            why: str | None = status
        elif attempt is None:
            why = "its materialization names no attempt"
        else:
            why = why_changed_on_storage(warehouse, request, record.run_id, str(attempt.value))
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
