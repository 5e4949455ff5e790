"""The shadow rollout, end to end with real materializations (the local launcher trains
and scores from each trainer version's own archive; the Iceberg tables and the champion
pointer are on a file:// warehouse).

The world changes after day B: the price's effect on clicks turns around. The champion
(version 1, inventory only) keeps its modest live AUC. Version 2 (price and inventory,
trained before the change) is better on holdout and worse on live days: it shadows, never
serves, and is retired naming its days. Version 3 (the same features, trained after the
change) is better on live days too: it serves after its N shadow days."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, write_partition
from tests.support.scoring import LABELS, champion_metadata, transforms_for, write_days
from tests.support.training import TABLE, make_model, resources
from zipline_dagster import (
    DeploymentSpec,
    EventSource,
    Metric,
    ModelSpecError,
    ModelTransforms,
    RolloutStrategy,
)
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.lineage.partitions import champion_asset_key, model_asset_key, table_asset_key
from zipline_dagster.rollout.live import SHADOW_CHECK
from zipline_dagster.scoring.monitoring import monitoring_asset_key
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import blob_store

B = "2026-09-11"
LIVE = days_ending("2026-09-18", 7)
SHADOW = RolloutStrategy(
    rollout_metric_thresholds=[Metric("holdout_auc", 0.5)],
    regression_tolerance=0.02,
    kind="shadow",
    days=2,
)


def _configs(features: str) -> dict[str, str]:
    return {"label-column": "label", "eval-days": "1", "features": features, "num-rounds": "20"}


def _version(tmp_path: Path, base: str, tag: str) -> str:
    """A trainer version of its own: the reference trainer with a comment of ``tag``."""
    if not tag:
        src = TRAINERS / "listing_ctr_model"
    else:
        src = tmp_path / f"trainer_{tag}"
        shutil.copytree(
            TRAINERS / "listing_ctr_model", src, ignore=shutil.ignore_patterns("__pycache__")
        )
        with (src / "trainer" / "train.py").open("a") as f:
            f.write(f"# trainer version {tag}\n")
    return publish_trainer_archive(src, model_name="listing_ctr_model", base=base).version


@pytest.mark.slow
def test_a_challenger_worse_live_never_serves_and_a_better_one_serves_after_n_days(
    file_base: str, tmp_path: Path
) -> None:
    write_days(file_base, days_ending(B, 5))
    for ds in LIVE:  # after B, dearer listings get the clicks
        frame = ctr_rows(ds, 300, price_effect=1.2)
        write_partition(file_base, TABLE, ds, frame)
        write_partition(file_base, LABELS, ds, frame[["listing_id", "label"]])
    versions = [_version(tmp_path, file_base, tag) for tag in ("", "two", "three")]
    features = [
        "inventory_count:inventory_count",
        "price_log:price_log,inventory_count:inventory_count",
    ]
    store, instance = blob_store(file_base), dg.DagsterInstance.ephemeral()

    def stage(n: int) -> tuple[Any, ModelTransforms, dg.JobDefinition]:
        """The code location with trainer version ``n`` (1-based) declared."""
        model = dataclasses.replace(
            make_model(versions[n - 1], file_base, job_configs=_configs(features[min(n, 2) - 1])),
            deployment_conf=DeploymentSpec(rollout_strategy=SHADOW),
        )
        t = transforms_for(model, score_with="champion")
        defs = build_definitions(
            external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
            models=[model],
            transforms=[t],
            resources=resources(None, file_base),
            automation=False,
        )
        return model, t, defs.resolve_implicit_global_asset_job_def()

    def run(job: dg.JobDefinition, key: dg.AssetKey, ds: str | None = None) -> Any:
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )
        assert result.success
        return result

    def shadow_check(result: Any) -> Any:
        (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == SHADOW_CHECK]
        return check

    def latest(key: dg.AssetKey, ds: str) -> dict[str, Any]:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[ds]), limit=1
        ).records
        mat = records[0].asset_materialization
        assert mat is not None
        return {k: v.value for k, v in mat.metadata.items()}

    def score_and_monitor(job: dg.JobDefinition, t: ModelTransforms, days: list[str]) -> None:
        for ds in days:
            run(job, table_asset_key(t.table), ds)
            run(job, monitoring_asset_key(t), ds)

    # version 1 is the champion
    model, t, job = stage(1)
    champion = champion_asset_key(model.name)
    run(job, model_asset_key(model.name), B)
    run(job, champion)
    v1, v2, v3 = versions
    assert getattr(cp.read_champion(store, model), "where", None) == f"{v1}/{B}"

    # version 2, better on holdout, becomes the challenger, not the champion
    model, t, job = stage(2)
    run(job, model_asset_key(model.name), B)
    md = champion_metadata(run(job, champion))
    assert md["moved"] is False and md["ds"] == B and md["version"] == v1
    assert (
        f"{v2}/{B} (trainer version {v2}, new) passes every gate and becomes the challenger"
        in (md["reason"])
    )
    pointer = cp.read_champion(store, model)
    assert pointer is not None and pointer.shadowed_by is not None
    assert pointer.shadowed_by.where == f"{v2}/{B}"
    assert pointer.shadowed_by.metrics["holdout_auc"] > pointer.metrics["holdout_auc"]

    # each day is scored by both: the champion serves, the challenger beside
    score_and_monitor(job, t, LIVE[:1])
    scored = latest(table_asset_key(t.table), LIVE[0])
    assert (scored["model_version"], scored["model_ds"]) == (v1, B)
    assert (scored["challenger/model_version"], scored["challenger/model_ds"]) == (v2, B)
    assert scored["challenger/rows"] == 300
    monitored = latest(monitoring_asset_key(t), LIVE[0])
    assert monitored["challenger/realized/auc"] < monitored["realized/auc"] - 0.1
    one_day = run(job, champion)
    assert shadow_check(one_day).passed
    assert "1 of 2 monitored days scored by both" in shadow_check(one_day).description

    # worse on its live days: retired, naming them; the champion stays
    score_and_monitor(job, t, LIVE[1:2])
    retired = run(job, champion)
    md, check = champion_metadata(retired), shadow_check(retired)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert md["moved"] is False and (md["version"], md["ds"]) == (v1, B)
    for text in (f"challenger {v2}/{B} retired", f"on {LIVE[0]}, {LIVE[1]} of its 2 shadow days"):
        assert text in check.description and text in md["reason"]
    pointer = cp.read_champion(store, model)
    assert pointer is not None and pointer.where == f"{v1}/{B}" and pointer.shadowed_by is None
    assert pointer.challenger is not None and pointer.challenger.status == cp.RETIRED
    assert f"{LIVE[0]}: auc 0." in pointer.challenger.verdict
    assert f"{v2}/*" in pointer.retired
    # the version is not advanced to again
    stays = champion_metadata(run(job, champion))
    assert stays["moved"] is False and "retired: trainer version" in stays["rejected"][B]["retired"]

    # version 3, trained after the change, shadows and then serves
    model, t, job = stage(3)
    run(job, model_asset_key(model.name), LIVE[3])
    run(job, champion)
    pointer = cp.read_champion(store, model)
    assert pointer is not None and getattr(pointer.shadowed_by, "where", None) == f"{v3}/{LIVE[3]}"
    kept = [
        p for p in cp.history(store, model) if p.challenger and p.challenger.status == "retired"
    ]
    assert kept and f"challenger {v2}/{B} retired" in kept[-1].challenger.verdict  # type: ignore[union-attr]
    score_and_monitor(job, t, LIVE[4:6])
    promoted = run(job, champion)
    md, check = champion_metadata(promoted), shadow_check(promoted)
    assert check.passed
    assert md["moved"] is True and (md["version"], md["ds"]) == (v3, LIVE[3])
    assert f"challenger {v3}/{LIVE[3]} promoted after 2 shadow days" in md["reason"]
    pointer = cp.read_champion(store, model)
    assert pointer is not None and pointer.where == f"{v3}/{LIVE[3]}"
    assert f"{LIVE[4]}: auc " in pointer.why and f"({v1}/{B})" in pointer.why
    assert pointer.challenger is None
    # no day was served by a challenger before it was promoted
    for ds in LIVE[:2] + LIVE[4:6]:
        assert latest(table_asset_key(t.table), ds)["model_version"] == v1
    # each partition's card says what the champion decided about it
    base = Path(file_base.removeprefix("file://"), "models", model.name)
    card_v2 = (base / v2 / B / "card.md").read_text()
    assert f"became the challenger of the champion {v1}/{B} (shadow)" in card_v2
    assert f"retired (challenger {v2}/{B} retired: worse than the champion" in card_v2
    card_v3 = (base / v3 / LIVE[3] / "card.md").read_text()
    assert f"became the champion: challenger {v3}/{LIVE[3]} promoted after 2" in card_v3
    # and the next day is the new champion's, from its own archive
    run(job, table_asset_key(t.table), LIVE[6])
    assert latest(table_asset_key(t.table), LIVE[6])["model_version"] == v3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "canary"}, "kind='canary' is invalid; expected one of 'immediate', 'shadow'"),
        (
            {"kind": "shadow", "rollout_metric_thresholds": [Metric("holdout_auc", 0.6)]},
            "days=None is invalid; kind='shadow' needs the number of monitored days",
        ),
        ({"kind": "shadow", "days": 3}, "rollout_metric_thresholds is empty"),
        ({"days": 3}, "days=3 is the shadow rollout's; it means nothing with kind='immediate'"),
    ],
)
def test_a_shadow_rollout_is_validated_at_declaration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelSpecError) as err:
        RolloutStrategy(**kwargs)
    assert message in str(err.value)


def test_a_shadow_model_scored_by_another_than_its_champion_is_refused(file_base: str) -> None:
    model = dataclasses.replace(
        make_model("0123456789ab", file_base), deployment_conf=DeploymentSpec(SHADOW)
    )
    with pytest.raises(ModelSpecError) as err:
        ModelTransforms(sources=[EventSource(table=TABLE)], models=[model], output_namespace="ctr")
    assert "score_with='newest_passing', but listing_ctr_model's rollout is kind='shadow'" in (
        str(err.value)
    )


def test_a_day_with_nothing_compared_does_not_count_toward_the_verdict(file_base: str) -> None:
    """A day on which no threshold metric was realized for both (one class labelled: no
    AUC) is no evidence: the challenger waits for N days that compared something."""
    from zipline_dagster.rollout import shadow

    model = dataclasses.replace(
        make_model("0123456789ab", file_base), deployment_conf=DeploymentSpec(SHADOW)
    )
    challenger = cp.Challenger("ba9876543210", B, f"{file_base}/x")
    blind = shadow.PairedDay(LIVE[0], f"0123456789ab/{B}", {"logloss": 0.6}, {"logloss": 0.5})
    seen = shadow.PairedDay(LIVE[1], f"0123456789ab/{B}", {"auc": 0.6}, {"auc": 0.61})
    waits = shadow.judge(model, challenger, [blind, seen])
    assert waits.action is None and "1 of 2 monitored days" in waits.summary
    later = shadow.PairedDay(LIVE[2], f"0123456789ab/{B}", {"auc": 0.6}, {"auc": 0.62})
    promoted = shadow.judge(model, challenger, [blind, seen, later])
    assert promoted.action == "promote"
    assert LIVE[0] not in promoted.summary and LIVE[2] in promoted.summary
