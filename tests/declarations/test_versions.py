"""A code version covers exactly what changes what an asset writes: a change of the
declaration shows the asset unsynced; a description, a gate or where artifacts live does
not."""

from __future__ import annotations

import dataclasses

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster import DeploymentSpec, Metric, Query, ResourceConfig, RolloutStrategy, Window
from zipline_dagster.declarations.model import EventSource, Model
from zipline_dagster.declarations.versions import (
    gates_version,
    model_code_version,
    monitoring_code_version,
    scores_code_version,
)

MODEL = demo.listing_ctr_model


def conf(**kw: object) -> Model:
    return dataclasses.replace(MODEL, training_conf=dataclasses.replace(MODEL.training_conf, **kw))


def test_what_a_model_trains_on_changes_its_code_version() -> None:
    base = model_code_version(MODEL)
    assert base.startswith(MODEL.version + "-")
    fewer = ",".join(demo.FEATURES[:-1])
    changed = {
        "a feature removed": conf(
            job_configs={**MODEL.training_conf.job_configs, "features": fewer}
        ),
        "a flag": conf(job_configs={**MODEL.training_conf.job_configs, "max-depth": "6"}),
        "the window": conf(training_data_window=Window(5)),
        "the columns read": conf(
            training_data_source=EventSource(
                table=MODEL.table, query=Query(selects={"label": "label"})
            )
        ),
        "Ray Train workers": conf(resource_config=ResourceConfig(min_replica_count=2)),
        "the task": dataclasses.replace(MODEL, task="regression"),
        "the trainer": dataclasses.replace(MODEL, version="0123456789ab"),
    }
    for what, model in changed.items():
        assert model_code_version(model) != base, what
    same = {
        "a description": dataclasses.replace(MODEL, description="clicks"),
        "a gate": dataclasses.replace(
            MODEL,
            deployment_conf=DeploymentSpec(RolloutStrategy([Metric("holdout_auc", 0.9)])),
        ),
        "where artifacts live": dataclasses.replace(MODEL, model_artifact_base_uri="file:///x"),
        "the first partition": conf(
            training_data_source=dataclasses.replace(
                MODEL.training_conf.training_data_source,
                query=dataclasses.replace(
                    MODEL.training_conf.training_data_source.query, start_partition="2026-06-01"
                ),
            )
        ),
    }
    for what, model in same.items():
        assert model_code_version(model) == base, what


def test_scores_follow_the_model_and_monitoring_its_labels_and_task() -> None:
    t = demo.listing_scores
    flag = conf(job_configs={**MODEL.training_conf.job_configs, "max-depth": "6"})
    assert scores_code_version(dataclasses.replace(t, models=[flag])) != scores_code_version(t)
    assert scores_code_version(dataclasses.replace(t, passthrough_fields=["view_id"], label_keys=["view_id"])) != scores_code_version(t)  # fmt: skip
    # how far a realized metric may fall only judges: it stales nothing
    same = dataclasses.replace(t, realized_auc_tolerance=0.2)
    assert monitoring_code_version(same) == monitoring_code_version(t)
    other = dataclasses.replace(t, label_column="label2")
    assert monitoring_code_version(other) != monitoring_code_version(t)
    # the champion's version is its gates
    stricter = dataclasses.replace(
        MODEL, deployment_conf=DeploymentSpec(RolloutStrategy([Metric("holdout_auc", 0.9)]))
    )
    assert gates_version(stricter) != gates_version(MODEL)
    assert gates_version(dataclasses.replace(MODEL, description="x")) == gates_version(MODEL)


def test_a_models_description_shows_in_the_ui_and_not_in_its_version() -> None:
    from zipline_dagster.training.assets import build_model_asset

    described = dataclasses.replace(MODEL, description="Clicks on listing views.")
    asset = build_model_asset(model=described)
    (text,) = asset.descriptions_by_key.values()
    assert text.startswith("Clicks on listing views. Trains listing_ctr_model")
    assert asset.code_versions_by_key == build_model_asset(model=MODEL).code_versions_by_key
