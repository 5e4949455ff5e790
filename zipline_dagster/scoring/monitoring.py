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
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from zipline_runtime import stats

from zipline_dagster.declarations.deployment import DIRECTIONS
from zipline_dagster.declarations.tasks import REALIZED_METRICS, Task, task_of
from zipline_dagster.declarations.transforms import ModelTransforms, ScoreWith
from zipline_dagster.declarations.versions import monitoring_code_version
from zipline_dagster.lineage.internals import backfilling
from zipline_dagster.lineage.ledger import Ledger, prefixed
from zipline_dagster.lineage.partitions import (
    PARTITIONS_PER_RUN,
    SCORED_BY,
    latest_materialization,
    latest_metadata,
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
from zipline_dagster.storage.days import shift_day
from zipline_dagster.storage.paths import model_dir_uri
from zipline_dagster.storage.resources import WarehouseResource


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
    scores: Any, labels: Any, keys: list[str], label_column: str, task: Task
) -> dict[str, Any]:
    """The joined rows' realized metrics of ``task`` (``tasks.REALIZED_METRICS``, plus the
    mean score, and the positive rate or mean label), and the row counts; a metric that
    is undefined is ``None`` with a reason in ``status``.

    Raises:
        MonitoringError: the label column does not fit the task (a classifier's label
            that is not 0 or 1).
    """
    joined = scores.merge(labels[[*keys, label_column]], on=keys, how="inner")
    out: dict[str, Any] = {
        "rows_scored": len(scores),
        "rows_labelled": len(labels),
        "rows_joined": len(joined),
        **dict.fromkeys(REALIZED_METRICS[task]),
        "mean_score": None,
        "status": {},
    }
    if len(joined) == 0:
        out["status"]["all"] = "no scored row has a label"
        return out
    y = joined[label_column].astype(float).to_numpy()
    p = joined["score"].astype(float).to_numpy()
    out["mean_score"] = float(p.mean())
    out.update(_METRICS[task](y, p, label_column, out["status"]))
    return out


def _classification(y: Any, p: Any, column: str, status: dict[str, str]) -> dict[str, Any]:
    odd = sorted({float(v) for v in y} - {0.0, 1.0})
    if odd:
        raise MonitoringError(
            f"the label column {column!r} holds {odd[0]:g}"
            + (f" and {len(odd) - 1} other value(s)" if len(odd) > 1 else "")
            + " besides 0 and 1: a classifier's label is 0 or 1 (a continuous label is a "
            "regression's: declare Model(task='regression'))"
        )
    out: dict[str, Any] = {
        "positive_rate": float(y.mean()),
        "logloss": stats.log_loss(y, p),
        "accuracy": stats.accuracy(y, p),
    }
    if len(set(y.tolist())) < 2:
        status["auc"] = f"the labelled rows have one class (all {int(y[0])})"
    else:
        out["auc"] = stats.roc_auc(y, p)
    return out


def _regression(y: Any, p: Any, column: str, status: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mean_label": float(y.mean()),
        "rmse": stats.rmse(y, p),
        "mae": stats.mae(y, p),
    }
    if float(y.min()) == float(y.max()):
        status["r2"] = f"every labelled row has the same {column} ({y[0]:g}): R² is undefined"
    else:
        out["r2"] = stats.r2(y, p)
    return out


_METRICS = {Task.CLASSIFICATION: _classification, Task.REGRESSION: _regression}


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
        tables = warehouse.tables()
        days = list(context.partition_keys)
        # each table read from the catalog once for the run's days
        scores = tables.days(transforms.table, only=days)
        labels = tables.days(labels_table, only=days)
        committed = {
            transforms.table: {ds: list(d.files) for ds, d in scores.items()},
            labels_table: {ds: list(d.files) for ds, d in labels.items()},
        }
        if transforms.model.rollout.shadow:  # the challenger's days, beside
            shadowed = tables.days(transforms.challenger_table, only=days)
            committed[transforms.challenger_table] = {
                ds: list(d.files) for ds, d in shadowed.items()
            }
        done: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        ledger = Ledger(context.instance)
        for ds in days:
            try:
                commit = scores[ds].commit if ds in scores else None
                warn = prefixed(context.log.warning, f"{transforms.table} {ds}")
                why = ledger.admit(scores_key, ds, commit, warn)
                if why:  # left to the run that is writing them
                    raise MonitoringError(f"its scores: {why}; monitor it after")
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
    # The model partition(s) that produced the day's scores, their task and holdout values.
    used = sorted(
        {(str(v), str(d)) for v, d in zip(scores["model_version"], scores["model_ds"], strict=True)}
    )
    model, report = transforms.model, None
    if len(used) == 1:
        version, model_ds = used[0]
        report = g.read_partition_report(
            warehouse.store(model.model_artifact_base_uri),
            model_dir_uri(model.model_artifact_base_uri, model.name, version, model_ds),
        )
    task = monitored_task(transforms, report)
    m = realized_metrics(scores, labels, keys, transforms.label_column, task)
    counts = ("status", "rows_scored", "rows_labelled", "rows_joined")
    md: dict[str, Any] = {
        f"realized/{k}": dg.MetadataValue.float(float(v))
        for k, v in m.items()
        if k not in counts and v is not None
    }
    for k in counts[1:]:
        md[k] = dg.MetadataValue.int(int(m[k]))
    md["status"] = dg.MetadataValue.json(m["status"] or {"all": "every metric computed"})
    md["task"] = dg.MetadataValue.text(str(task))
    if len(used) == 1:
        md["model_version"] = dg.MetadataValue.text(used[0][0])
        md[SCORED_BY] = dg.MetadataValue.text(used[0][1])
        holdout = report_metrics(report or {})
        for key in REALIZED_METRICS[task]:
            if (value := holdout.get(f"holdout_{key}")) is not None:
                md[f"training/holdout_{key}"] = dg.MetadataValue.float(value)
    md.update(_challenger(transforms, ds, store, committed, labels, task))
    return md


def _challenger(
    transforms: ModelTransforms,
    ds: str,
    store: BlobStore,
    committed: dict[str, dict[str, list[str]]],
    labels: Any,
    task: Task,
) -> dict[str, Any]:
    """The realized metrics of the challenger that shadow-scored day ``ds`` (the table
    beside the scores, ``scoring.shadow``), under ``challenger/``; none when it did not."""
    table, keys = transforms.challenger_table, list(transforms.label_keys)
    if ds not in committed.get(table, {}):
        return {}
    scores = _read(
        store, committed[table], table, ds, [*keys, "score", "model_version", "model_ds"]
    )
    if len(scores) == 0:
        return {}
    m = realized_metrics(scores, labels, keys, transforms.label_column, task)
    md: dict[str, Any] = {
        f"challenger/realized/{k}": dg.MetadataValue.float(float(m[k]))
        for k in (*REALIZED_METRICS[task], "mean_score")
        if m.get(k) is not None
    }
    md["challenger/model_version"] = dg.MetadataValue.text(str(scores["model_version"].iloc[0]))
    md[f"challenger/{SCORED_BY}"] = dg.MetadataValue.text(str(scores["model_ds"].iloc[0]))
    md["challenger/rows_joined"] = dg.MetadataValue.int(int(m["rows_joined"]))
    return md


def monitored_task(transforms: ModelTransforms, report: Mapping[str, Any] | None) -> Task:
    """The task whose metrics monitoring computes: the model's declared one (its checks
    are that task's); an undeclared model's report must agree with the default.

    Raises:
        MonitoringError: the model declares no task and its report says another than
            classification, whose checks the monitoring asset has.
    """
    declared = checked_task(transforms)
    found = task_of(transforms.model.task, report)
    if found is not declared:
        raise MonitoringError(
            f"model {transforms.model.name!r} declares no task and its report says {found}: "
            f"declare Model(task={str(found)!r}) so that monitoring computes and checks "
            f"{', '.join(REALIZED_METRICS[found])}"
        )
    return declared


def checked_task(transforms: ModelTransforms) -> Task:
    """The task whose realized metrics the monitoring checks judge (fixed at load): the
    model's declared task, classification when it declares none."""
    return task_of(transforms.model.task, None)


def realized_check_name(key: str) -> str:
    return f"realized_{key}"


def build_monitoring_checks(
    transforms: ModelTransforms,
) -> list[dg.AssetChecksDefinition]:
    """A warning check per realized metric of the model's task, per partition, judged from
    the partition's latest materialization (its own step after the asset's, so that a
    backfill run of a range judges every day of it)."""
    key = monitoring_asset_key(transforms)
    metrics = REALIZED_METRICS[checked_task(transforms)]
    specs = [
        dg.AssetCheckSpec(
            realized_check_name(m),
            asset=key,
            description=f"Warns when the realized {m} is worse than the model's holdout_{m} "
            f"threshold, or more than its tolerance ({transforms.tolerance(m):g}) worse than "
            "the holdout value of the model partition that scored the day.",
            partitions_def=scoring_partitions(transforms),
        )
        for m in metrics
    ]

    @dg.multi_asset_check(
        specs=specs,
        name=f"{key.path[-1]}_realized",
        can_subset=True,
        description="The realized metrics of each scored day against the holdout's.",
    )
    def _realized(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        def judge(ds: str) -> list[tuple[str, dg.AssetCheckResult]]:
            found = latest_metadata(context.instance, key, ds)
            md: dict[str, Any] = found or {}
            status = md["status"] if isinstance(md.get("status"), dict) else {}
            out = []
            for m in metrics:
                why = (
                    (status.get(m) or status.get("all"))
                    if found is not None
                    else f"{ds} is not monitored yet"
                )
                realized, holdout = md.get(f"realized/{m}"), md.get(f"training/holdout_{m}")
                result = realized_check(
                    transforms,
                    m,
                    float(realized) if isinstance(realized, (int, float)) else None,
                    float(holdout) if isinstance(holdout, (int, float)) else None,
                    str(why) if why else None,
                )
                out.append((realized_check_name(m), result))
            return out

        yield from judge_partitions(context, key, judge, blocking=(), what=transforms.table)

    return [_realized]


def realized_problems(
    transforms: ModelTransforms, metric: str, value: float | None, holdout: float | None
) -> list[str]:
    """What is wrong with realized ``metric``: it fails the model's ``holdout_{metric}``
    gate, or is worse than the holdout value by more than the metric's tolerance (in the
    metric's direction)."""
    gate = transforms.model.rollout.threshold(f"holdout_{metric}")
    problems: list[str] = []
    if value is None:
        return problems
    if gate is not None and not gate.passes(value):
        problems.append(f"realized {metric} {value:.4f} fails the gate {gate.describe()}")
    tol = transforms.tolerance(metric)
    if holdout is not None:
        worse = holdout - value if DIRECTIONS[metric] else value - holdout
        if worse > tol:
            problems.append(
                f"realized {metric} {value:.4f} is {worse:.4f} worse than the training holdout "
                f"{metric} {holdout:.4f} (tolerance {tol:g})"
            )
    return problems


def realized_check(
    transforms: ModelTransforms,
    metric: str,
    value: float | None,
    holdout: float | None,
    why: str | None,
) -> dg.AssetCheckResult:
    """Realized ``metric`` against the model's ``holdout_{metric}`` gate and against the
    holdout value, within the metric's tolerance (``realized_problems``)."""
    problems = realized_problems(transforms, metric, value, holdout)
    if value is None:
        problems.append(f"no realized {metric} ({why or 'no labelled rows'})")
    md: dict[str, float] = {"tolerance": transforms.tolerance(metric)}
    if value is not None and math.isfinite(value):
        md[f"realized_{metric}"] = value
    if holdout is not None:
        md[f"holdout_{metric}"] = holdout
    if (gate := transforms.model.rollout.threshold(f"holdout_{metric}")) is not None:
        md["threshold"] = gate.threshold
    compared = "the holdout" if holdout is not None else "no holdout value"
    summary = "; ".join(problems) or f"realized {metric} {value:.4f} holds against {compared}"
    return dg.AssetCheckResult(
        check_name=realized_check_name(metric),
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
