"""Scores tables in a test: the days, the labels, a scored model's definitions."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import dagster as dg

from tests.helpers import (
    ctr_rows,
    write_partition,
)
from tests.support.training import TABLE, make_model, resources
from zipline_dagster import (
    DeploymentSpec,
    EventSource,
    ModelTransforms,
)
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.jobs.archive import publish_trainer_archive

LABELS = "ctr.labels_t"
D1, D2, D3 = "2026-09-10", "2026-09-11", "2026-09-12"


def transforms_for(model: Any, **declared: Any) -> ModelTransforms:
    """The test model's scores table, monitored against ``LABELS`` (``declared``: more
    ``ModelTransforms`` fields, such as ``score_with``)."""
    return ModelTransforms(
        sources=[EventSource(table=TABLE)],
        models=[model],
        passthrough_fields=["listing_id"],
        output_namespace="ctr",
        labels=EventSource(table=LABELS),
        label_keys=["listing_id"],
        **declared,
    )


def scoring_defs(
    trainer: Path,
    base: str,
    launcher: str | None,
    *,
    champion: bool = False,
    deployment: DeploymentSpec | None = None,
    **declared: Any,
) -> tuple[str, Any, ModelTransforms, dg.Definitions]:
    """The trainer published under ``base``; its version, the model (with its
    ``deployment``, when given), its scores table (``transforms_for`` with ``declared``;
    scored by the model's champion with ``champion``) and the definitions over the source
    and labels tables."""
    version = publish_trainer_archive(trainer, model_name="listing_ctr_model", base=base).version
    model = make_model(version, base)
    if deployment is not None:
        model = dataclasses.replace(model, deployment_conf=deployment)
    t = transforms_for(model, score_with="champion" if champion else "newest_passing", **declared)
    defs = build_definitions(
        external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
        models=[model],
        transforms=[t],
        resources=resources(launcher, base),
        automation=False,
    )
    return version, model, t, defs


def write_days(base: str, days: list[str], rows: int = 300) -> None:
    """``rows`` source rows a day, and their labels."""
    for ds in days:
        frame = ctr_rows(ds, rows)
        write_partition(base, TABLE, ds, frame)
        write_partition(base, LABELS, ds, frame[["listing_id", "label"]])


def champion_metadata(result: Any) -> dict[str, Any]:
    """The metadata of the one champion materialization of ``result``."""
    (event,) = result.get_asset_materialization_events()
    mat = event.event_specific_data.materialization  # type: ignore[union-attr]
    return {k: v.value for k, v in mat.metadata.items()}


def booster_scores(model_dir: Path, frame: Any) -> Any:
    """What the booster of the model partition at ``model_dir`` predicts for ``frame``'s
    rows (its two features), computed here with xgboost itself."""
    import xgboost as xgb

    features = ["price_log", "inventory_count"]
    booster = xgb.Booster()
    booster.load_model(str(model_dir / "model.json"))
    return booster.predict(
        xgb.DMatrix(frame[features].to_numpy(dtype=float), feature_names=features)
    )
