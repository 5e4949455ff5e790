"""The champion asset's judgements on live days, as its checks: the rollback policy
(``rollout.policy``: the champion against its own holdout) and the shadow rollout
(``rollout.shadow``: the challenger against the champion). Each is a warning-severity
check that says what it found, and fails naming the days when it acted on them.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from zipline_dagster.declarations.model import Model
from zipline_dagster.lineage.partitions import champion_asset_key
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout import policy, shadow
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import BlobStore

#: The champion asset's check under a rollback policy: its live metrics hold.
LIVE_CHECK = "champion_holds_live"
#: The champion asset's check under a shadow rollout: what its challenger's days showed.
SHADOW_CHECK = "challenger_shadow"


def check_specs(model: Model) -> list[dg.AssetCheckSpec]:
    """The checks the model's declared rollout adds to its champion asset."""
    r, key, specs = model.rollout, champion_asset_key(model.name), []
    if r.rollback_after_days:
        specs.append(
            dg.AssetCheckSpec(
                LIVE_CHECK,
                asset=key,
                description=f"The champion's realized metrics hold against its holdout (a "
                f"rollback after {r.rollback_after_days} monitored days running worse than it "
                f"by more than {r.regression_tolerance:g}); fails naming the days when the "
                "champion was rolled back.",
            )
        )
    if r.shadow:
        specs.append(
            dg.AssetCheckSpec(
                SHADOW_CHECK,
                asset=key,
                description=f"A new trainer version's challenger is scored beside the champion "
                f"for {r.days} monitored days, then serves if not worse than it by more than "
                f"{r.regression_tolerance:g}, or is retired; fails naming the days when it "
                "was retired.",
            )
        )
    return specs


def checks(
    context: dg.AssetExecutionContext,
    store: BlobStore,
    model: Model,
    live_keys: Sequence[dg.AssetKey],
    by: str,
) -> list[tuple[dg.AssetCheckResult, ch.Decision | None]]:
    """The declared judgements on live days, in order (a rollback first; the challenger
    only when the champion was not rolled back): each one's check result and the decision
    when it moved the champion or retired its challenger."""
    out = []
    if model.rollout.rollback_after_days:
        out.append(rollback_check(context, store, model, live_keys, by))
    if model.rollout.shadow and not any(d is not None for _, d in out):
        out.append(shadow_check(context, store, model, live_keys, by))
    return out


def _result(name: str, passed: bool, summary: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=summary,
        metadata={"summary": dg.MetadataValue.text(summary)},
    )


def shadow_check(
    context: dg.AssetExecutionContext,
    store: BlobStore,
    model: Model,
    live_keys: Sequence[dg.AssetKey],
    by: str,
) -> tuple[dg.AssetCheckResult, ch.Decision | None]:
    """The challenger judged (``rollout.shadow``): the check (fails when it was retired)
    and the decision when it was promoted or retired."""
    verdict, decision = shadow.apply(
        store, model, lambda c: shadow.paired_days(context.instance, live_keys, c), by=by
    )
    if decision is not None:
        log = context.log.info if verdict.action == "promote" else context.log.warning
        log(f"{model.name}: {decision.reason}")
    retired = decision is not None and verdict.action == "retire"
    return _result(SHADOW_CHECK, not retired, decision.reason if decision else verdict.summary), (
        decision
    )


def rollback_check(
    context: dg.AssetExecutionContext,
    store: BlobStore,
    model: Model,
    live_keys: Sequence[dg.AssetKey],
    by: str,
) -> tuple[dg.AssetCheckResult, ch.Decision | None]:
    """The rollback policy applied (``rollout.policy``): its check result (a warning that
    fails naming the days when the champion was rolled back, or could not be), and the
    decision when it rolled the champion back (None: the champion is judged as usual)."""
    current = cp.read_champion(store, model)
    try:
        verdict, restored = policy.apply(
            store,
            model,
            current,
            lambda c: policy.live_days(context.instance, live_keys, c),
            by=by,
        )
        summary, passed = verdict.summary, restored is None
    except ch.ChampionError as exc:
        restored, passed = None, False
        summary = f"the rollback policy would roll {model.name} back, but {exc}"
        context.log.warning(summary)
    result = _result(LIVE_CHECK, passed, summary)
    if restored is None:
        return result, None
    context.log.warning(f"{model.name} champion rolled back to {restored.where}: {summary}")
    return result, ch.Decision(restored, True, {}, summary)
