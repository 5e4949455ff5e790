"""Drift before labels: each scored day's population stability index (PSI) against the
model partition that scored it, and its warning checks.

The scoring job measures it (``zipline_runtime.stats.drift_of``) while it has the day's rows in
memory: each feature's PSI against the partition's training window, and the scores' PSI
against its holdout predictions, from the histograms the trainer's report carries
(``drift_reference``: no second pass over training data). The job writes them into the
scores file's key-value metadata; the step that commits the file records them as the
day's metadata (floats: plotted across partitions), and two checks per scored day judge
them against the declared ``ModelTransforms.drift_warn`` / ``drift_fail``: a warning
from ``drift_warn`` on, an error-severity failure from ``drift_fail`` on; neither blocks.
"""

import json
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from zipline_runtime.stats import DRIFT_KEY

from zipline_dagster.declarations.transforms import ModelTransforms
from zipline_dagster.lineage.partitions import latest_metadata, table_asset_key
from zipline_dagster.rollout.assets import judge_partitions

FEATURES_CHECK, PREDICTIONS_CHECK = "drift_features", "drift_predictions"
PSI_PREFIX, PREDICTIONS_PSI = "drift/psi/", "drift/psi_predictions"
#: Features named in a day's ``drift/top_features``.
TOP = 3


def drift_from_file(schema_metadata: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    """The drift a scoring job wrote into its file's metadata ({} when it wrote none)."""
    raw = (schema_metadata or {}).get(DRIFT_KEY)
    if not raw:
        return {}
    try:
        drift = json.loads(raw)
    except ValueError:
        return {}
    return drift if isinstance(drift, dict) else {}


def drift_metadata(drift: Mapping[str, Any]) -> dict[str, Any]:
    """A scored day's ``drift/*`` metadata."""
    features = {
        str(k): float(v)
        for k, v in (drift.get("features") or {}).items()
        if isinstance(v, (int, float))
    }
    md: dict[str, Any] = {
        f"{PSI_PREFIX}{k}": dg.MetadataValue.float(v) for k, v in features.items()
    }
    predictions = drift.get("predictions")
    if isinstance(predictions, (int, float)):
        md[PREDICTIONS_PSI] = dg.MetadataValue.float(float(predictions))
    if features:
        top = sorted(features.items(), key=lambda kv: -kv[1])[:TOP]
        md["drift/max_feature_psi"] = dg.MetadataValue.float(top[0][1])
        md["drift/top_features"] = dg.MetadataValue.text(", ".join(f"{k} {v:.3f}" for k, v in top))
    return md


def drift_line(metadata: Mapping[str, Any]) -> str:
    """``predictions PSI 0.012; top features price_log 0.031, ...`` (the demo's line)."""
    predictions = metadata.get(PREDICTIONS_PSI)
    parts = [f"predictions PSI {predictions:.3f}" if predictions is not None else "no drift"]
    if top := metadata.get("drift/top_features"):
        parts.append(f"top features {top}")
    return "; ".join(parts)


def judge_day(
    transforms: ModelTransforms, metadata: Mapping[str, Any], ds: str
) -> list[tuple[str, dg.AssetCheckResult]]:
    """Day ``ds``'s two drift checks from its scores metadata."""
    features = {
        k[len(PSI_PREFIX) :]: float(v) for k, v in metadata.items() if k.startswith(PSI_PREFIX)
    }
    predictions = metadata.get(PREDICTIONS_PSI)
    none = (
        f"{ds} is not scored yet"
        if not metadata
        else "no drift measured: the model partition's report carries no drift reference "
        "(trained before it did) or the day had no rows"
    )
    return [
        (FEATURES_CHECK, _result(transforms, FEATURES_CHECK, features, none)),
        (
            PREDICTIONS_CHECK,
            _result(
                transforms,
                PREDICTIONS_CHECK,
                {"predictions": float(predictions)} if predictions is not None else {},
                none,
            ),
        ),
    ]


def _result(
    transforms: ModelTransforms, name: str, psis: Mapping[str, float], none: str
) -> dg.AssetCheckResult:
    warn, fail = transforms.drift_warn, transforms.drift_fail
    if not psis:
        return dg.AssetCheckResult(
            check_name=name, passed=True, description=none, metadata={"summary": none}
        )
    ranked = sorted(psis.items(), key=lambda kv: -kv[1])
    worst = ranked[0][1]
    shown = ", ".join(f"{k} PSI {v:.3f}" for k, v in ranked[:TOP])
    if worst >= fail:
        summary, severity = f"drifted (PSI >= {fail:g}): {shown}", dg.AssetCheckSeverity.ERROR
    elif worst >= warn:
        summary, severity = f"drifting (PSI >= {warn:g}): {shown}", dg.AssetCheckSeverity.WARN
    else:
        summary, severity = f"stable (PSI < {warn:g}): {shown}", dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(
        check_name=name,
        passed=worst < warn,
        severity=severity,
        description=summary,
        metadata={
            "summary": dg.MetadataValue.text(summary),
            "max_psi": dg.MetadataValue.float(worst),
            "warn": dg.MetadataValue.float(float(warn)),
            "fail": dg.MetadataValue.float(float(fail)),
        },
    )


def build_drift_checks(
    transforms: ModelTransforms, partitions_def: dg.PartitionsDefinition
) -> list[dg.AssetChecksDefinition]:
    """The two drift checks of each scored day, judged from the day's latest scores
    materialization (their own step, so that a range run judges every day of it)."""
    key = table_asset_key(transforms.table)
    specs = [
        dg.AssetCheckSpec(
            name,
            asset=key,
            description=f"The day's {what} PSI against the model partition that scored it "
            f"({ref}): warns from {transforms.drift_warn:g}, fails from "
            f"{transforms.drift_fail:g}; never blocks.",
            partitions_def=partitions_def,
        )
        for name, what, ref in (
            (FEATURES_CHECK, "features'", "its training window"),
            (PREDICTIONS_CHECK, "scores'", "its holdout predictions"),
        )
    ]

    @dg.multi_asset_check(
        specs=specs,
        name=f"{key.path[-1]}_drift",
        can_subset=True,
        description="Each scored day's drift against the model that scored it.",
    )
    def _drift(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        def judge(ds: str) -> list[tuple[str, dg.AssetCheckResult]]:
            return judge_day(transforms, latest_metadata(context.instance, key, ds) or {}, ds)

        yield from judge_partitions(context, key, judge, blocking=(), what=transforms.table)

    return [_drift]
