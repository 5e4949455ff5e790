"""A model partition's card: a short Markdown page of what it is, shown by Dagster on the
partition's materialization and written beside its artifacts (``card.md``).

It says what trained it (the trainer archive's version and the declaration's code
version), what it read (the input table's Iceberg snapshot and the window), with which
flags, its metrics beside the declared gates with each verdict, what it cost, and the
champion decision about it as far as it is known when it trained: the champion it will
be compared with and the tolerance. ``champions/{model}`` decides once its blocking
checks have run, and appends each decision about the partition to ``card.md``
(``rollout.cards``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zipline_dagster.declarations.model import Model
from zipline_dagster.jobs.cost import Cost
from zipline_dagster.storage.artifacts import report_metrics
from zipline_dagster.storage.champion_pointer import ChampionPointer


@dataclass(frozen=True)
class CardInput:
    """What a partition's card is made of (the training step has each)."""

    model: Model
    ds: str
    code_version: str
    archive_uri: str
    window: Sequence[str]
    #: the input table, its snapshot id and metadata file
    input: Mapping[str, Any]
    flags: Sequence[str]
    report: Mapping[str, Any]
    cost: Cost | None
    champion: ChampionPointer | None


def model_card(card: CardInput) -> str:
    """The card's Markdown."""
    model = card.model
    window = (
        f"{card.window[0]}..{card.window[-1]} ({len(card.window)} days)" if card.window else "-"
    )
    lines = [
        f"### {model.name} {card.ds}",
        "",
        "| | |",
        "|---|---|",
        f"| trainer version | `{model.version}` |",
        f"| declaration (code version) | `{card.code_version}` |",
        f"| trainer archive | `{card.archive_uri}` |",
        f"| runtime | `{model.runtime}` (zipline-runtime, shipped beside the archive) |",
        f"| input | `{card.input.get('table')}` snapshot `{card.input.get('snapshot_id')}` |",
        f"| window | {window} |",
        f"| cost | {card.cost.line() if card.cost is not None else 'not measured'} |",
        "",
        "**Flags**: " + " ".join(f"`{f}`" for f in card.flags),
        "",
        *_metrics_table(model, card.report),
        "",
        f"**Champion**: {_champion_line(model, card.champion)}",
    ]
    return "\n".join(lines) + "\n"


def _metrics_table(model: Model, report: Mapping[str, Any]) -> list[str]:
    metrics = report_metrics(dict(report))
    gates = {m.name: m for m in model.rollout.rollout_metric_thresholds}
    rows = ["| metric | value | gate | verdict |", "|---|---|---|---|"]
    for name, value in sorted(metrics.items()):
        if name.endswith("_rows"):
            continue
        gate = gates.get(name)
        shown = "n/a" if value is None else f"{value:.4f}"
        if gate is None:
            rows.append(f"| {name} | {shown} | - | - |")
            continue
        verdict = "n/a" if value is None else ("pass" if gate.passes(value) else "**FAIL**")
        rows.append(f"| {name} | {shown} | {gate.describe()} | {verdict} |")
    missing = [n for n in gates if n not in metrics]
    rows += [f"| {n} | not reported | {gates[n].describe()} | **FAIL** |" for n in missing]
    return rows


def _champion_line(model: Model, champion: ChampionPointer | None) -> str:
    tolerance = model.rollout.regression_tolerance
    if champion is None:
        return (
            "none when this partition trained; it becomes the champion if it passes every "
            f"gate (`champions/{model.name}` decides)"
        )
    held = ", ".join(
        f"{k} {v:.4f}"
        for k, v in sorted(champion.metrics.items())
        if k in {m.name for m in model.rollout.rollout_metric_thresholds}
    )
    return (
        f"`{champion.where}` when this partition trained ({held or 'no gated metric'}); this "
        f"one replaces it if it passes every gate and no gated metric is more than "
        f"{tolerance:g} worse (`champions/{model.name}` decides; its history names the outcome)"
    )
