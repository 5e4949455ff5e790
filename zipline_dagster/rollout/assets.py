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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.declarations.versions import gates_version
from zipline_dagster.events import ChampionEvaluated, PartitionJudged, PlatformListener
from zipline_dagster.lineage.internals import backfilling, check_target
from zipline_dagster.lineage.ledger import Judge, Ledger, prefixed
from zipline_dagster.lineage.partitions import (
    champion_asset_key,
    latest_materialization,
    model_asset_key,
)
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import gates as g
from zipline_dagster.rollout import live as on_live
from zipline_dagster.rollout.cards import note_decisions
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStore
from zipline_dagster.storage.champion_pointer import ChampionPointer
from zipline_dagster.storage.manifests import ModelPartition
from zipline_dagster.storage.paths import model_partition_uri
from zipline_dagster.storage.resources import WarehouseResource

# Partitioned asset checks are marked preview in Dagster 1.13; per-partition gates are
# what we need, so we rely on them deliberately and say so once here.
warnings.filterwarnings(
    "ignore", category=dg.PreviewWarning, message=".*partitions_def on an AssetCheckSpec.*"
)


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
    r = latest_materialization(instance, key, ds)
    return None if r is None else check_target(r)


def _evaluation(
    key: dg.AssetKey,
    ds: str,
    name: str,
    result: dg.AssetCheckResult,
    target: Any,
    blocking: bool,
) -> dg.AssetCheckEvaluation:
    """Check ``name``'s ``result`` on ``key`` partition ``ds``, as an evaluation recorded
    against ``target`` (that partition's materialization)."""
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=name,
        passed=result.passed,
        metadata=result.metadata,
        target_materialization_data=target,
        severity=result.severity,
        description=result.description,
        blocking=blocking,
        partition=ds,
    )


def gate_results(
    model: Model, store: Any, ds: str, champion: ChampionPointer | None, selected: list[str]
) -> list[tuple[str, dg.AssetCheckResult]]:
    """The ``selected`` checks of model partition ``ds``: each gate, and the comparison
    with ``champion`` (warning severity)."""
    results = g.evaluate(model, store, ds)
    if g.NO_REGRESSION in selected:
        results[g.NO_REGRESSION] = g.compare_with_champion(model, store, ds, champion)
    uri = model_partition_uri(model, ds)
    warn, error = dg.AssetCheckSeverity.WARN, dg.AssetCheckSeverity.ERROR
    return [
        (n, check_result(results[n], error if n in g.GATES else warn, artifact_uri=uri))
        for n in selected
    ]


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
            evaluation: Any = _evaluation(key, ds, name, result, target, name in blocking)
            context.op_execution_context.log_event(evaluation)
            if not result.passed:
                context.log.warning(f"{what} {ds} {name} failed: {result.description}")
    context.log.info(
        f"check results recorded against each of the {len(context.partition_keys)} "
        "partitions of this range; Dagster's note that this step yielded no check outputs "
        "concerns the range as a whole and is expected"
    )


def build_model_checks(
    model: Model, partitions_def: dg.PartitionsDefinition
) -> list[dg.AssetChecksDefinition]:
    """The model's gates as blocking, partitioned checks, evaluated together in one step,
    and the comparison with the champion as a warning-severity check that never blocks.

    A run of one partition yields one result per selected gate. A backfill run of a range
    (``jobs.ranges.run_days``) evaluates every partition of the range and records each gate's
    result against its own partition, as Dagster cannot yet attach a check result to one
    partition of a range.
    """
    key = model_asset_key(model.name)
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
        context: dg.AssetCheckExecutionContext,
        warehouse: WarehouseResource,
        mlflow: PlatformListener,
    ) -> Iterator[dg.AssetCheckResult]:
        selected = [c.name for c in context.selected_asset_check_keys if c.name in g.CHECKS]
        store = warehouse.store(model.model_artifact_base_uri)
        champion = cp.read_champion(store, model) if g.NO_REGRESSION in selected else None
        listening = mlflow.listening(context.log.warning, context.log.info, warehouse.store)

        def judge(ds: str) -> list[tuple[str, dg.AssetCheckResult]]:
            results = gate_results(model, store, ds, champion, selected)
            if listening is not None:
                gates = {n: (r.passed, r.description or "") for n, r in results if n in g.GATES}
                listening.partition_judged(
                    PartitionJudged(model, key.to_user_string(), store, ds, gates)
                )
            return results

        yield from judge_partitions(context, key, judge, blocking=g.GATES, what=model.name)

    return [_gates]


def gate_judge(*models: Model, store: Callable[[str], BlobStore]) -> Judge:
    """The ledger's judge for these models' partitions recorded from storage: each gate's
    evaluation (and the comparison with the champion, a warning), against that
    partition's latest materialization; nothing for another asset. ``store`` opens
    storage as the code location's runs do (``WarehouseResource.store``)."""
    by_key = {model_asset_key(m.name): m for m in models}

    def judge(
        instance: dg.DagsterInstance, key: dg.AssetKey, ds: str
    ) -> list[dg.AssetCheckEvaluation]:
        model = by_key.get(key)
        if model is None:
            return []
        models_store = store(model.model_artifact_base_uri)
        champion = cp.read_champion(models_store, model)
        target = _target(instance, key, ds)
        return [
            _evaluation(key, ds, name, result, target, name in g.GATES)
            for name, result in gate_results(model, models_store, ds, champion, list(g.CHECKS))
        ]

    return judge


def why_in_flight(
    ledger: Ledger,
    model: Model,
    partition: ModelPartition,
    warn: Callable[[str], None],
) -> str | None:
    """The ledger's rule for a model partition (as storage holds it, just read): why it
    is left to a run still writing it, or None when it may be judged (recorded into
    Dagster from storage first, with ``warn`` told, when its run ended without recording
    it)."""
    return ledger.admit(
        model_asset_key(model.name),
        partition.ds,
        partition.commit(),
        prefixed(warn, f"{model.name} partition {partition.ds}"),
    )


def judged_gates(
    store: BlobStore, model: Model
) -> Callable[[str, str], dict[str, tuple[bool, str]]]:
    """The gates of a trained partition (version, ds) of ``model`` as they judge it now."""

    def judged(version: str, ds: str) -> dict[str, tuple[bool, str]]:
        results = g.evaluate(model, store, ds, version=version)
        return {n: (r.passed, r.summary) for n, r in results.items()}

    return judged


def build_champion_asset(
    model: Model,
    *,
    automation_condition: dg.AutomationCondition | None = None,
    live_keys: Sequence[dg.AssetKey] = (),
) -> dg.AssetsDefinition:
    """The champion asset; with a rollback policy or a shadow rollout declared,
    ``live_keys`` are the monitoring assets whose realized metrics it judges the champion
    (``rollout.policy``) and the challenger (``rollout.shadow``) on, and its checks say
    what it found (``rollout.live``)."""

    @dg.asset(
        key=champion_asset_key(model.name),
        group_name="champions",
        deps=[model_asset_key(model.name)],
        # the gates it judges under: changed gates show it unsynced, and its next
        # evaluation judges the champion under them
        code_version=gates_version(model),
        kinds={"python"},
        description=(
            f"The {model.name} partition in use: {cp.champion_uri(model)}. Advances to the "
            "newest trained partition whose blocking gates all pass; moved by hand with "
            f"`zipline-dagster promote {model.name} --ds D` / `rollback {model.name}`."
        ),
        automation_condition=automation_condition,
        metadata={"zipline/champion_uri": cp.champion_uri(model)},
        check_specs=[
            dg.AssetCheckSpec(
                CHAMPION_CHECK,
                asset=champion_asset_key(model.name),
                description="The champion passes the model's current gates (after the gates "
                "change, it keeps serving until a partition passes them; this check names "
                "the gates it fails).",
            ),
            *on_live.check_specs(model),
        ],
    )
    def _champion(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource, mlflow: PlatformListener
    ) -> dg.MaterializeResult:
        store = warehouse.store(model.model_artifact_base_uri)
        ledger = Ledger(context.instance, judge=gate_judge(model, store=warehouse.store))
        by = f"dagster run {context.run.run_id}"
        checks = on_live.checks(context, store, model, live_keys, by)
        decided = next((d for _, d in checks if d is not None), None)
        decision = decided or ch.advance(
            store,
            model,
            by=by,
            in_flight=lambda partition: why_in_flight(
                ledger, model, partition, context.log.warning
            ),
        )
        md = decision_metadata(decision)
        log_decision(context.log, model, decision)
        p = decision.pointer
        listening = mlflow.listening(context.log.warning, context.log.info, warehouse.store)
        if listening is not None:
            evaluated = ChampionEvaluated(
                model,
                model_asset_key(model.name).to_user_string(),
                store,
                p,
                decision.moved,
                judged=judged_gates(store, model),
                attempt_gone=lambda pointer: bool(ch.why_pinned_attempt_gone(store, pointer)),
            )
            md.update(listening.champion_evaluated(evaluated))
        note_decisions(
            store, model, decision, when=f"{by} at {ch.now_iso()}", warn=context.log.warning
        )
        if decision.left_behind:  # the pointer is written: recorded as it is on storage
            md["left_behind"] = dg.MetadataValue.json(decision.left_behind)
            context.log.warning(ch.lock_left_behind(model, decision.left_behind))
        return dg.MaterializeResult(
            metadata=md, check_results=[champion_check(decision), *(c for c, _ in checks)]
        )

    return _champion


def decision_metadata(decision: ch.Decision) -> dict[str, Any]:
    """The champion's materialization metadata: whether it moved and why, the partition
    it points at with its metrics, and the partitions passed over with their gates."""
    md: dict[str, Any] = {
        "moved": dg.MetadataValue.bool(decision.moved),
        "reason": dg.MetadataValue.text(decision.reason),
    }
    p = decision.pointer
    if p is not None:
        md.update(
            version=dg.MetadataValue.text(p.version),
            ds=dg.MetadataValue.text(p.ds),
            artifact_uri=dg.MetadataValue.path(p.artifact_uri),
            pointer=dg.MetadataValue.json(p.to_json()),
        )
        for name, value in p.metrics.items():
            md[f"champion/{name}"] = dg.MetadataValue.float(value)
    if decision.rejected:
        md["rejected"] = dg.MetadataValue.json(
            {
                ds: {r.gate: r.summary for r in failed}
                for ds, failed in sorted(decision.rejected.items())
            }
        )
    return md


def log_decision(log: Any, model: Model, decision: ch.Decision) -> None:
    """The decision in the step's log: the move or the stay, each passed-over partition."""
    p = decision.pointer
    if decision.moved:
        log.info(f"{model.name} champion -> {p and p.ds}: {decision.reason}")
    else:
        log.info(f"{model.name} champion {decision.reason}")
    for ds, failed in sorted(decision.rejected.items()):
        log.warning(
            f"{model.name} {ds} not promoted: "
            + "; ".join(f"{r.gate}: {r.summary}" for r in failed)
        )


#: The champion asset's check: the champion passes the current gates.
CHAMPION_CHECK = "champion_passes_gates"


def champion_check(decision: ch.Decision) -> dg.AssetCheckResult:
    """Fails (error severity; the champion keeps serving) when the champion fails the
    current gates, or when there is none, naming the gates and the numbers."""
    if decision.pointer is None:
        summary = f"no champion: {decision.reason}"
    elif decision.failing:
        summary = "the champion fails " + "; ".join(r.summary for r in decision.failing)
    else:
        summary = "passes every current gate"
    return dg.AssetCheckResult(
        check_name=CHAMPION_CHECK,
        passed=decision.pointer is not None and not decision.failing,
        severity=dg.AssetCheckSeverity.ERROR,
        description=summary,
        metadata={"summary": dg.MetadataValue.text(summary)},
    )


def latest_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    """The storage id of ``key``'s newest materialization, any partition (0: none)."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1)
    return records.records[0].storage_id if records.records else 0


def build_champion_sensor(
    models: list[Model], *, live: Mapping[str, Sequence[dg.AssetKey]] | None = None
) -> dg.SensorDefinition:
    """Evaluates each model's champion whenever a partition of the model was materialized
    after the champion's last evaluation, by any path (the UI, a CLI backfill, a sensor,
    ``make demo``), whether or not a daemon ran then: it compares what the instance holds
    (the model's newest materialization against the champion's), not ticks. One run per
    new model materialization (its storage id is the run key). A champion that a backfill
    in progress targets is left to that backfill, which evaluates it once its model
    partitions are done; a model materialized meanwhile is seen once the backfill ends.
    A model with a rollback policy (``live``: its monitoring assets, by model name) is
    evaluated too when one of them was materialized after the champion's evaluation."""
    live = live or {}

    @dg.sensor(
        name="zipline_champions",
        asset_selection=dg.AssetSelection.assets(*(champion_asset_key(m.name) for m in models)),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Moves each model's champion after its partitions were materialized.",
    )
    def _champions(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest]:
        busy = backfilling(context.instance)
        for model in models:
            champion = champion_asset_key(model.name)
            trained = max(
                latest_storage_id(context.instance, key)
                for key in [model_asset_key(model.name), *live.get(model.name, ())]
            )
            if trained <= latest_storage_id(context.instance, champion):
                continue
            if champion in busy:
                context.log.info(f"{model.name}: its champion is left to backfill {busy[champion]}")
                continue
            yield dg.RunRequest(
                run_key=f"{model.name}-{trained}",
                asset_selection=[champion],
                tags={"zipline/champion": model.name},
            )

    return _champions
