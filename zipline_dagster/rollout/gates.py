"""The blocking gates of a trained model partition, computed from what storage holds.

One function per gate, each returning the numbers it judged; the Dagster asset checks,
the champion asset, scoring and ``zipline-dagster promote`` all call these, so the UI, the
pointer, the scores and the CLI never disagree about a partition.

The blocking gates judge the partition alone (its thresholds, its report, its manifest):
the same artifacts get the same verdict whenever they are judged, so retraining or
backfilling a past day never fails because of anything outside it. Comparing with the
champion (``check_no_regression``) is the champion's decision when it moves; the asset
check of that name only shows the comparison, with warning severity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zipline_runtime.contract import Report

from zipline_dagster.declarations.deployment import SPLITS, Metric
from zipline_dagster.declarations.model import Model
from zipline_dagster.storage.artifacts import ArtifactError, read_report, report_metrics
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStore
from zipline_dagster.storage.champion_pointer import ChampionPointer
from zipline_dagster.storage.manifests import PartitionState, model_partition
from zipline_dagster.storage.paths import MANIFEST_NAME, model_dir_uri

#: The gates, in the order they are shown.
THRESHOLDS = "rollout_thresholds"
NO_REGRESSION = "no_regression_vs_champion"
REPORT_COMPLETE = "report_complete"
MANIFEST_VERIFIES = "manifest_verifies"
#: What a partition must pass to be served or promoted: it alone decides them.
GATES = (THRESHOLDS, REPORT_COMPLETE, MANIFEST_VERIFIES)
#: The asset checks shown on a model partition: the gates, then the comparison with the
#: champion (warning severity, never blocking: the champion applies it when it moves).
CHECKS = (THRESHOLDS, NO_REGRESSION, REPORT_COMPLETE, MANIFEST_VERIFIES)

GATE_DESCRIPTIONS = {
    THRESHOLDS: "Every rollout_metric_threshold of the model's DeploymentSpec holds.",
    NO_REGRESSION: "Shown, never blocking: no threshold metric is worse than the current "
    "champion's beyond RolloutStrategy.regression_tolerance (the champion passes over a "
    "newer partition that is).",
    REPORT_COMPLETE: "The metrics report has every split and, for each missing metric, "
    "a status saying why.",
    MANIFEST_VERIFIES: f"The partition's {MANIFEST_NAME} exists and every file's sha256 "
    "matches (re-read from storage).",
}


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    #: One line naming the numbers that decided it.
    summary: str
    values: dict[str, Any] = field(default_factory=dict)
    #: False when nothing could be compared (a comparison with a champion that lacks
    #: the metric): not a pass, and not a reason to pass a partition over either.
    compared: bool = True


def _why_missing(report: Mapping[str, Any], name: str, values: dict[str, float | None]) -> str:
    if name not in values:
        held = ", ".join(sorted(values)) or "nothing"
        return f"{name} is not in the report (it holds {held})"
    split, _, metric = name.partition("_")
    why = (report.get("status") or {}).get(f"{split}.{metric}")
    return f"{name} is missing ({why})" if why else f"{name} is missing (no status given)"


def check_thresholds(
    model: Model, report: Mapping[str, Any], values: dict[str, float | None] | None = None
) -> GateResult:
    """The declared thresholds on ``report``'s metrics (``values``: the metrics as a
    champion pointer recorded them, instead of the report's)."""
    thresholds = model.rollout.rollout_metric_thresholds
    if not thresholds:
        return GateResult(THRESHOLDS, True, "no rollout thresholds declared")
    values = report_metrics(report) if values is None else values
    failed: list[str] = []
    shown: dict[str, Any] = {}
    for m in thresholds:
        value = values.get(m.name)
        shown[m.name] = value
        shown[f"{m.name}.threshold"] = m.threshold
        if value is None:
            failed.append(_why_missing(report, m.name, values))
        elif not m.passes(value):
            failed.append(f"{m.name}={value:.4f} fails {m.describe()}")
    if failed:
        return GateResult(THRESHOLDS, False, "; ".join(failed), shown)
    held = ", ".join(f"{m.name}={values[m.name]:.4f} ({m.describe()})" for m in thresholds)
    return GateResult(THRESHOLDS, True, held, shown)


def check_no_regression(
    model: Model, report: Mapping[str, Any], champion: ChampionPointer | None
) -> GateResult:
    thresholds: tuple[Metric, ...] = tuple(model.rollout.rollout_metric_thresholds)
    if champion is None:
        return GateResult(NO_REGRESSION, True, "no champion yet")
    if not thresholds:
        return GateResult(NO_REGRESSION, True, "no threshold metrics declared to compare")
    tol = model.rollout.regression_tolerance
    values = report_metrics(report)
    theirs = champion.metrics
    who = f"champion {champion.where}"
    failed: list[str] = []
    uncompared: list[str] = []
    shown: dict[str, Any] = {"tolerance": tol}
    for m in thresholds:
        mine, best = values.get(m.name), theirs.get(m.name)
        shown[m.name] = mine
        shown[f"{m.name}.champion"] = best
        if mine is None:
            failed.append(_why_missing(report, m.name, values))
            continue
        if not isinstance(best, (int, float)):
            uncompared.append(m.name)  # the champion has no number to compare against
            continue
        worse = (best - mine) if m.is_minimum else (mine - best)
        if worse > tol:
            failed.append(
                f"{m.name}={mine:.4f} is {worse:.4f} worse than the {who} ({best:.4f}); "
                f"tolerance {tol:g}"
            )
    not_compared = f"not compared: the {who} has no {', '.join(uncompared)}" if uncompared else ""
    if failed:
        summary = "; ".join(failed + ([not_compared] if uncompared else []))
        return GateResult(NO_REGRESSION, False, summary, shown)
    if uncompared:
        compared = len(uncompared) < len(thresholds)
        rest = (
            f" ({len(thresholds) - len(uncompared)} other(s) not worse beyond {tol:g})"
            if compared
            else ""
        )
        return GateResult(NO_REGRESSION, False, not_compared + rest, shown, compared=False)
    return GateResult(NO_REGRESSION, True, f"not worse than the {who} beyond {tol:g}", shown)


def check_report_complete(report: Mapping[str, Any] | None) -> GateResult:
    if report is None:
        return GateResult(REPORT_COMPLETE, False, "no metrics report (metrics.json) on storage")
    problems: list[str] = []
    status = report.get("status") or {}
    for split in SPLITS:
        part = report.get(split)
        if not isinstance(part, dict):
            problems.append(f"no {split!r} section")
            continue
        if "rows" not in part:
            problems.append(f"{split} has no row count")
        for metric, value in (part.get("metrics") or {}).items():
            if value is None and f"{split}.{metric}" not in status:
                problems.append(f"{split}.{metric} is missing and no status says why")
    if problems:
        return GateResult(REPORT_COMPLETE, False, "; ".join(problems), {"problems": problems})
    missing = {k: v for k, v in status.items() if k.split(".")[0] in SPLITS}
    summary = (
        f"complete; {len(missing)} missing metric(s), each with a status"
        if missing
        else "complete; every metric computed"
    )
    return GateResult(REPORT_COMPLETE, True, summary, {"status": status})


def check_manifest(store: BlobStore, model_dir: str) -> GateResult:
    partition = model_partition(store, model_dir, checksums=True)
    if partition.state is PartitionState.ABSENT:
        return GateResult(MANIFEST_VERIFIES, False, f"no {MANIFEST_NAME} at {model_dir}")
    if not partition.committed:
        return GateResult(
            MANIFEST_VERIFIES,
            False,
            f"a file listed in {model_dir}/{MANIFEST_NAME} is missing or its sha256 differs",
        )
    return GateResult(MANIFEST_VERIFIES, True, "every listed file re-read and matches")


def read_partition_report(store: BlobStore, model_dir: str) -> Report | None:
    """The partition's report as ``artifacts.read_report`` reads it (the one reader);
    None when there is none, or it is not a JSON object (a gate says so)."""
    try:
        return read_report(store, model_dir)
    except (BlobNotFoundError, ArtifactError):
        return None


def evaluate(
    model: Model, store: BlobStore, ds: str, *, version: str | None = None
) -> dict[str, GateResult]:
    """Every gate of partition ``ds`` (of ``version``, default the model's): a verdict on
    the partition's own artifacts alone."""
    model_dir = model_dir_uri(
        model.model_artifact_base_uri, model.name, version or model.version, ds
    )
    report = read_partition_report(store, model_dir)
    results = {
        REPORT_COMPLETE: check_report_complete(report),
        MANIFEST_VERIFIES: check_manifest(store, model_dir),
    }
    results[THRESHOLDS] = (
        check_thresholds(model, report)
        if report is not None
        else GateResult(THRESHOLDS, False, "no metrics report (metrics.json) on storage")
    )
    return {g: results[g] for g in GATES}


def compare_with_champion(
    model: Model, store: BlobStore, ds: str, champion: ChampionPointer | None
) -> GateResult:
    """Partition ``ds`` of the model's version against ``champion`` (a pointer), as the
    warning check shows it."""
    model_dir = model_dir_uri(model.model_artifact_base_uri, model.name, model.version, ds)
    report = read_partition_report(store, model_dir)
    if report is None:
        return GateResult(NO_REGRESSION, False, "no metrics report (metrics.json) on storage")
    return check_no_regression(model, report, champion)
