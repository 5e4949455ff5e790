"""Dagster wiring of the rollout gates and the champion pointer.

* Each model partition gets blocking, partitioned asset checks, one per gate
  (:mod:`zipline_dagster.rollout.gates`); a failed check carries the numbers that failed
  it, and, being blocking, stops anything downstream in the same run. They judge the
  partition alone. A warning-severity check beside them shows the comparison with the
  current champion; it never blocks.
* Each model gets a champion asset (``champions/{model}``, not partitioned) that
  advances the pointer to the newest trained partition passing every gate and not
  regressing beyond the declared tolerance, whenever a model partition is materialized
  (automation), and reports why it moved or stayed.
"""

import warnings
from collections.abc import Callable, Collection, Iterator
from typing import Any

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.lineage.partitions import latest_materialization
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import gates as g
from zipline_dagster.storage.paths import model_dir_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.metadata import unrecorded_on_storage

# Partitioned asset checks are marked preview in Dagster 1.13; per-partition gates are
# what we need, so we rely on them deliberately and say so once here.
warnings.filterwarnings(
    "ignore", category=dg.PreviewWarning, message=".*partitions_def on an AssetCheckSpec.*"
)


def model_asset_key(model: Model) -> dg.AssetKey:
    return dg.AssetKey(["models", model.name])


def champion_asset_key(model: Model) -> dg.AssetKey:
    return dg.AssetKey(["champions", model.name])


def _value(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return dg.MetadataValue.text(str(v))
    if isinstance(v, (int, float)):
        return dg.MetadataValue.float(float(v))
    if isinstance(v, (dict, list)):
        return dg.MetadataValue.json(v)
    return dg.MetadataValue.text(str(v))


def check_result(
    result: g.GateResult,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    **extra: Any,
) -> dg.AssetCheckResult:
    metadata = {"summary": dg.MetadataValue.text(result.summary)}
    metadata.update({k: _value(v) for k, v in {**result.values, **extra}.items()})
    return dg.AssetCheckResult(
        passed=result.passed,
        severity=severity,
        description=result.summary,
        metadata=metadata,
    )


def _target(instance: dg.DagsterInstance, key: dg.AssetKey, ds: str) -> Any:
    """The materialization of ``key`` partition ``ds`` a check evaluation is about."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    r = latest_materialization(instance, key, ds)
    if r is None:
        return None
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=r.storage_id, run_id=r.run_id, timestamp=r.timestamp
    )


def judge_partitions(
    context: dg.AssetCheckExecutionContext,
    key: dg.AssetKey,
    judge: Callable[[str], list[tuple[str, dg.AssetCheckResult]]],
    *,
    blocking: Collection[str],
    what: str,
) -> Iterator[dg.AssetCheckResult]:
    """The results ``judge`` gives (check name, result) for each partition of the run, of
    checks on ``key`` (those named in ``blocking`` block): yielded for a run of one
    partition; for a range, each recorded against its own partition and that partition's
    latest materialization (Dagster cannot yet attach a yielded result to one partition of
    a range), a failed one logged as a warning naming ``what``."""
    if context.has_partition_key:
        for name, result in judge(context.partition_key):
            yield dg.AssetCheckResult(
                passed=result.passed,
                asset_key=key,
                check_name=name,
                severity=result.severity,
                description=result.description,
                metadata=result.metadata,
            )
        return
    for ds in context.partition_keys:
        target = _target(context.instance, key, ds)
        for name, result in judge(ds):
            # log_event records check evaluations too (its annotation predates them)
            evaluation: Any = dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=result.passed,
                metadata=result.metadata,
                target_materialization_data=target,
                severity=result.severity,
                description=result.description,
                blocking=name in blocking,
                partition=ds,
            )
            context.op_execution_context.log_event(evaluation)
            if not result.passed:
                context.log.warning(f"{what} {ds} {name} failed: {result.description}")


def build_model_checks(
    model: Model, partitions_def: dg.PartitionsDefinition
) -> list[dg.AssetChecksDefinition]:
    """The model's gates as blocking, partitioned checks, evaluated together in one step,
    and the comparison with the champion as a warning-severity check that never blocks.

    A run of one partition yields one result per selected gate. A backfill run of a range
    (``train_range``) evaluates every partition of the range and records each gate's
    result against its own partition, as Dagster cannot yet attach a check result to one
    partition of a range.
    """
    key = model_asset_key(model)
    specs = [
        dg.AssetCheckSpec(
            gate,
            asset=key,
            description=g.GATE_DESCRIPTIONS[gate],
            blocking=gate in g.GATES,
            partitions_def=partitions_def,
        )
        for gate in g.CHECKS
    ]

    @dg.multi_asset_check(
        specs=specs,
        name=f"{model.name}_rollout_gates",
        can_subset=True,
        description=f"The rollout gates of {model.name}, one blocking check each, and the "
        "comparison with its champion (a warning).",
    )
    def _gates(
        context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
    ) -> Iterator[dg.AssetCheckResult]:
        selected = [c.name for c in context.selected_asset_check_keys if c.name in g.CHECKS]
        base = model.model_artifact_base_uri
        store = warehouse.store(base)
        compare = g.NO_REGRESSION in selected
        champion = ch.read_champion(store, model) if compare else None
        warn = dg.AssetCheckSeverity.WARN

        def judge(ds: str) -> list[tuple[str, dg.AssetCheckResult]]:
            results = g.evaluate(model, store, ds)
            uri = model_dir_uri(base, model.name, model.version, ds)
            checks = {n: check_result(r, artifact_uri=uri) for n, r in results.items()}
            if compare:
                shown = g.compare_with_champion(model, store, ds, champion)
                checks[g.NO_REGRESSION] = check_result(shown, warn, artifact_uri=uri)
            return [(name, checks[name]) for name in selected]

        yield from judge_partitions(context, key, judge, blocking=g.GATES, what=model.name)

    return [_gates]


def build_champion_asset(
    model: Model, *, automation_condition: dg.AutomationCondition | None = None
) -> dg.AssetsDefinition:
    @dg.asset(
        key=champion_asset_key(model),
        group_name="champions",
        deps=[model_asset_key(model)],
        kinds={"python"},
        description=(
            f"The {model.name} partition in use: {ch.champion_uri(model)}. Advances to the "
            "newest trained partition whose blocking gates all pass; moved by hand with "
            f"`zipline-dagster promote {model.name} --ds D` / `rollback {model.name}`."
        ),
        automation_condition=automation_condition,
        metadata={"zipline/champion_uri": ch.champion_uri(model)},
    )
    def _champion(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        store = warehouse.store(model.model_artifact_base_uri)
        key = model_asset_key(model)
        decision = ch.advance(
            store,
            model,
            by=f"dagster run {context.run.run_id}",
            unrecorded=lambda ds, manifest: unrecorded_on_storage(
                context.instance, key, ds, manifest
            ),
        )
        md: dict[str, Any] = {
            "moved": dg.MetadataValue.bool(decision.moved),
            "reason": dg.MetadataValue.text(decision.reason),
        }
        p = decision.pointer
        if p is not None:
            md.update(
                version=dg.MetadataValue.text(str(p["version"])),
                ds=dg.MetadataValue.text(str(p["ds"])),
                artifact_uri=dg.MetadataValue.path(str(p["artifact_uri"])),
                pointer=dg.MetadataValue.json(p),
            )
            for name, value in (p.get("metrics") or {}).items():
                md[f"champion/{name}"] = dg.MetadataValue.float(float(value))
        if decision.rejected:
            md["rejected"] = dg.MetadataValue.json(
                {
                    ds: {r.gate: r.summary for r in failed}
                    for ds, failed in sorted(decision.rejected.items())
                }
            )
        if decision.moved:
            context.log.info(f"{model.name} champion -> {p and p['ds']}: {decision.reason}")
        else:
            context.log.info(f"{model.name} champion {decision.reason}")
        for ds, failed in sorted(decision.rejected.items()):
            context.log.warning(
                f"{model.name} {ds} not promoted: "
                + "; ".join(f"{r.gate}: {r.summary}" for r in failed)
            )
        if decision.left_behind:  # the pointer is written: recorded as it is on storage
            md["left_behind"] = dg.MetadataValue.json(decision.left_behind)
            context.log.warning(ch.lock_left_behind(model, decision.left_behind))
        return dg.MaterializeResult(metadata=md)

    return _champion


def champion_condition() -> dg.AutomationCondition:
    """Re-evaluate the champion whenever a model partition was materialized (the asset
    itself decides, from storage, whether a newer partition passes every gate)."""
    return (
        dg.AutomationCondition.any_deps_updated()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("a model partition was trained")
