"""Monitoring a deployed model: realized metrics once the labels of a scored day exist.

A daily asset per ``ModelTransforms`` with ``labels``: partition ``ds`` joins the scores
of day ``ds`` to the labels of day ``ds`` and records AUC, logloss, positive rate, mean
score and row counts as numeric metadata (plotted across partitions in the UI), plus a
check that warns when the realized AUC is below the model's ``holdout_auc`` threshold or
more than ``realized_auc_tolerance`` below the holdout AUC of the model partition that
produced the scores.
"""

import io
import math
from collections.abc import Iterator
from typing import Any

import dagster as dg

from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith
from zipline_dagster.declarations.versions import monitoring_code_version
from zipline_dagster.lineage.internals import backfilling
from zipline_dagster.lineage.ledger import Ledger, State
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
    SCORED_BY,
    latest_materialization,
    model_asset_key,
    record_range,
    scored_by,
    table_asset_key,
)
from zipline_dagster.rollout import gates as g
from zipline_dagster.rollout.assets import judge_partitions
from zipline_dagster.scoring.assets import scoring_partitions
from zipline_dagster.storage.artifacts import report_metrics
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.paths import model_dir_uri, table_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import (
    committed_partitions,
    committed_scan,
    shift_day,
)

REALIZED_CHECK = "realized_auc"


class MonitoringError(RuntimeError):
    """The scores or labels of the day are not there; the message names them."""


def monitoring_asset_key(transforms: ModelTransforms) -> dg.AssetKey:
    ns, name = transforms.table.split(".", 1)
    return dg.AssetKey(["monitoring", ns, name])


def _read(
    store: BlobStore, committed: dict[str, list[str]], table: str, ds: str, columns: list[str]
) -> Any:
    """Day ``ds``'s ``columns`` of ``table`` (``committed``: its committed days' files)."""
    import pandas as pd
    import pyarrow.parquet as pq

    files = committed.get(ds)
    if files is None:
        raise MonitoringError(f"{table} partition {ds} is missing (not committed)")
    frames = [
        pq.read_table(io.BytesIO(store.read_bytes(f)), columns=columns).to_pandas() for f in files
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def realized_metrics(
    scores: Any, labels: Any, keys: list[str], label_column: str
) -> dict[str, Any]:
    """The joined rows' AUC, logloss, positive rate and mean score, and the row counts
    (an AUC needs both classes: ``None`` and a reason otherwise)."""
    from sklearn.metrics import log_loss, roc_auc_score

    joined = scores.merge(labels[[*keys, label_column]], on=keys, how="inner")
    y = joined[label_column].astype(int).to_numpy()
    p = joined["score"].astype(float).to_numpy()
    out: dict[str, Any] = {
        "rows_scored": len(scores),
        "rows_labelled": len(labels),
        "rows_joined": len(joined),
        "auc": None,
        "logloss": None,
        "positive_rate": None,
        "mean_score": None,
        "status": {},
    }
    if len(joined) == 0:
        out["status"]["all"] = "no scored row has a label"
        return out
    out["positive_rate"] = float(y.mean())
    out["mean_score"] = float(p.mean())
    out["logloss"] = float(log_loss(y, p, labels=[0, 1]))
    if len(set(y.tolist())) < 2:
        out["status"]["auc"] = f"the labelled rows have one class (all {int(y[0])})"
    else:
        out["auc"] = float(roc_auc_score(y, p))
    return out


def build_monitoring_asset(
    transforms: ModelTransforms, *, automation_condition: dg.AutomationCondition | None = None
) -> dg.AssetsDefinition:
    """The realized metrics of a scores table, one partition per scored day. A backfill
    hands a run up to ``PARTITIONS_PER_RUN`` days, each its own materialization; a day
    whose scores or labels are missing fails only itself."""
    assert transforms.labels is not None
    labels_table = transforms.labels.table
    key = monitoring_asset_key(transforms)
    scores_key = table_asset_key(transforms.table)
    same_day = dg.TimeWindowPartitionMapping(start_offset=0, end_offset=0)

    @dg.asset(
        key=key,
        group_name="monitoring",
        partitions_def=scoring_partitions(transforms),
        deps=[
            dg.AssetDep(table_asset_key(transforms.table), partition_mapping=same_day),
            dg.AssetDep(table_asset_key(labels_table), partition_mapping=same_day),
        ],
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=PARTITIONS_PER_RUN),
        kinds={"python"},
        code_version=monitoring_code_version(transforms),
        automation_condition=automation_condition,
        description=(
            f"Realized metrics of {transforms.table} against the labels in {labels_table} "
            f"(joined on {', '.join(transforms.label_keys)}), per scored day."
        ),
    )
    def _monitor(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        store = warehouse.store(warehouse.uri)
        days = list(context.partition_keys)
        # each table listed once for the run's days
        scores = committed_scan(store, table_uri(warehouse.uri, transforms.table))
        committed = {
            transforms.table: {ds: files for ds, (files, _) in scores.items()},
            labels_table: committed_partitions(store, warehouse.uri, labels_table),
        }
        done: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        ledger = Ledger(context.instance)
        for ds in days:
            try:
                day = ledger.settle(scores_key, ds, scores[ds][1] if ds in scores else None)
                if day.state is State.RECORDED:
                    context.log.warning(f"{transforms.table} {ds}: {day.describe()}")
                elif day.state is State.IN_FLIGHT:  # left to the run that is writing them
                    raise MonitoringError(f"its scores: {day.describe()}; monitor it after")
                done[ds] = monitor_day(transforms, ds, store, committed, warehouse)
                context.log.info(
                    f"{ds}: "
                    + ", ".join(f"{k} {v.value}" for k, v in done[ds].items() if k != "status")
                )
            except MonitoringError as exc:
                errors[ds] = f"cannot monitor {transforms.table} {ds}: {exc}"
        if len(days) == 1 and errors:
            raise dg.Failure(errors[days[0]])
        return record_range(
            context, days, done, errors, name=key.to_user_string(), verb="monitored"
        )

    return _monitor


def monitor_day(
    transforms: ModelTransforms,
    ds: str,
    store: BlobStore,
    committed: dict[str, dict[str, list[str]]],
    warehouse: WarehouseResource,
) -> dict[str, Any]:
    """Day ``ds``'s realized metrics as materialization metadata (``committed``: the
    scores and labels tables' committed days, by table).

    Raises:
        MonitoringError: the day's scores or labels are not committed.
    """
    keys = list(transforms.label_keys)
    assert transforms.labels is not None
    scores = _read(
        store,
        committed[transforms.table],
        transforms.table,
        ds,
        [*keys, "score", "model_version", "model_ds"],
    )
    labels_table = transforms.labels.table
    labels = _read(
        store, committed[labels_table], labels_table, ds, [*keys, transforms.label_column]
    )
    m = realized_metrics(scores, labels, keys, transforms.label_column)
    md: dict[str, Any] = {
        f"realized/{k}": dg.MetadataValue.float(float(v))
        for k, v in m.items()
        if k not in ("status", "rows_scored", "rows_labelled", "rows_joined") and v is not None
    }
    for k in ("rows_scored", "rows_labelled", "rows_joined"):
        md[k] = dg.MetadataValue.int(int(m[k]))
    md["status"] = dg.MetadataValue.json(m["status"] or {"all": "every metric computed"})
    # The model partition(s) that produced the day's scores, and their holdout AUC.
    used = sorted(
        {(str(v), str(d)) for v, d in zip(scores["model_version"], scores["model_ds"], strict=True)}
    )
    if len(used) == 1:
        model = transforms.model
        version, model_ds = used[0]
        md["model_version"] = dg.MetadataValue.text(version)
        md[SCORED_BY] = dg.MetadataValue.text(model_ds)
        report = g.read_partition_report(
            warehouse.store(model.model_artifact_base_uri),
            model_dir_uri(model.model_artifact_base_uri, model.name, version, model_ds),
        )
        holdout = report_metrics(report or {}).get("holdout_auc")
        if holdout is not None:
            md["training/holdout_auc"] = dg.MetadataValue.float(holdout)
    return md


def build_monitoring_checks(
    transforms: ModelTransforms,
) -> list[dg.AssetChecksDefinition]:
    """The realized-AUC check of the monitoring asset: a warning, per partition, judged
    from the partition's latest materialization (its own step after the asset's, so that
    a backfill run of a range judges every day of it)."""
    key = monitoring_asset_key(transforms)
    spec = dg.AssetCheckSpec(
        REALIZED_CHECK,
        asset=key,
        description="Warns when the realized AUC is below the model's holdout_auc threshold "
        "or drops more than realized_auc_tolerance below the holdout AUC of the model "
        "partition that scored the day.",
        partitions_def=scoring_partitions(transforms),
    )

    @dg.multi_asset_check(
        specs=[spec],
        name=f"{key.path[-1]}_{REALIZED_CHECK}",
        can_subset=True,
        description=spec.description,
    )
    def _realized(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        def judge(ds: str) -> list[tuple[str, dg.AssetCheckResult]]:
            record = latest_materialization(context.instance, key, ds)
            mat = record.asset_materialization if record is not None else None
            if mat is None:
                return [
                    (
                        REALIZED_CHECK,
                        realized_check(transforms, None, None, f"{ds} is not monitored yet"),
                    )
                ]
            md: dict[str, Any] = {k: v.value for k, v in mat.metadata.items()}
            status = md["status"] if isinstance(md.get("status"), dict) else {}
            auc, holdout = md.get("realized/auc"), md.get("training/holdout_auc")
            why = status.get("auc") or status.get("all")
            result = realized_check(
                transforms,
                float(auc) if isinstance(auc, (int, float)) else None,
                float(holdout) if isinstance(holdout, (int, float)) else None,
                str(why) if why else None,
            )
            return [(REALIZED_CHECK, result)]

        yield from judge_partitions(context, key, judge, blocking=(), what=transforms.table)

    return [_realized]


def realized_check(
    transforms: ModelTransforms, auc: float | None, holdout: float | None, why: str | None
) -> dg.AssetCheckResult:
    model = transforms.model
    threshold = next(
        (m.threshold for m in model.rollout.rollout_metric_thresholds if m.name == "holdout_auc"),
        None,
    )
    tol = transforms.realized_auc_tolerance
    problems: list[str] = []
    if auc is None:
        problems.append(f"no realized AUC ({why or 'no labelled rows'})")
    else:
        if threshold is not None and auc < threshold:
            problems.append(
                f"realized AUC {auc:.4f} is below the holdout_auc threshold {threshold:g}"
            )
        if holdout is not None and holdout - auc > tol:
            problems.append(
                f"realized AUC {auc:.4f} is {holdout - auc:.4f} below the training holdout AUC "
                f"{holdout:.4f} (tolerance {tol:g})"
            )
    md: dict[str, Any] = {"tolerance": tol}
    if auc is not None and math.isfinite(auc):
        md["realized_auc"] = auc
    if holdout is not None:
        md["holdout_auc"] = holdout
    if threshold is not None:
        md["threshold"] = threshold
    summary = (
        "; ".join(problems)
        if problems
        else (f"realized AUC {auc:.4f} holds" if auc is not None else "no AUC")
    )
    return dg.AssetCheckResult(
        check_name=REALIZED_CHECK,
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN,
        description=summary,
        metadata={
            **{k: dg.MetadataValue.float(float(v)) for k, v in md.items()},
            "summary": dg.MetadataValue.text(summary),
        },
    )


def build_rescoring_sensor(transforms: list[ModelTransforms]) -> dg.SensorDefinition:
    """Scores a day again when the older model partition that scored it (its ds-1 had
    failed its gates) is materialized again. Dagster's lineage maps day ds to partition
    ds-1 only: its automation re-requests day d0+1 when d0 is retrained, this sensor the
    later days d0 scored in their place (each day whose latest materialization names
    ``model_ds`` d0 and is older than d0's), with their monitoring. While a backfill that
    targets the scores is in progress it waits: that backfill scores what it planned."""
    fallback = [t for t in transforms if t.score_with is ScoreWith.NEWEST_PASSING]
    keys = {
        t.table: [table_asset_key(t.table), *([monitoring_asset_key(t)] if t.labels else [])]
        for t in fallback
    }

    @dg.sensor(
        name="zipline_rescoring",
        asset_selection=dg.AssetSelection.assets(*(k for ks in keys.values() for k in ks)),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Scores again the days an older model partition scored once it is retrained.",
    )
    def _rescoring(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest]:
        instance, seen = context.instance, int(context.cursor or 0)
        busy = backfilling(instance)
        if any(table_asset_key(t.table) in busy for t in fallback):
            return
        newest = seen
        for t in fallback:
            scores, days = table_asset_key(t.table), scoring_partitions(t)
            retrained = instance.fetch_materializations(
                dg.AssetRecordsFilter(
                    asset_key=model_asset_key(t.model.name), after_storage_id=seen
                ),
                limit=10_000,
                ascending=True,
            ).records
            for model in retrained:
                newest = max(newest, model.storage_id)
                d0, day = str(model.partition_key), shift_day(str(model.partition_key), 2)
                while days.has_partition_key(day):
                    record = latest_materialization(instance, scores, day)
                    mat = record.asset_materialization if record is not None else None
                    if record is None or mat is None or scored_by(mat.metadata) != d0:
                        break
                    if record.storage_id < model.storage_id:
                        yield dg.RunRequest(
                            run_key=f"{t.table}-{day}-{model.storage_id}",
                            asset_selection=keys[t.table],
                            partition_key=day,
                            tags={"zipline/rescored": f"{t.model.name} {d0} was retrained"},
                        )
                    day = shift_day(day, 1)
        context.update_cursor(str(newest))

    return _rescoring
