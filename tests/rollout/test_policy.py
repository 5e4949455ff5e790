"""Rollback by policy, end to end with real materializations (the local launcher trains
and scores; the Iceberg tables and the champion pointer are on a file:// warehouse): the
champion's realized AUC falls below its holdout AUC beyond the tolerance on K monitored
days running, and the champion asset moves back to the champion it replaced, retires the
partition it left and says why in its check; it never advances to it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, write_partition
from tests.support.scoring import LABELS, champion_metadata, scoring_defs, write_days
from tests.support.training import TABLE
from zipline_dagster import DeploymentSpec, Metric, ModelSpecError, RolloutStrategy
from zipline_dagster.lineage.partitions import champion_asset_key, table_asset_key
from zipline_dagster.rollout import by_hand
from zipline_dagster.rollout import champion as ch
from zipline_dagster.rollout.live import LIVE_CHECK
from zipline_dagster.scoring.monitoring import monitoring_asset_key
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import blob_store

A, B = "2026-09-10", "2026-09-11"
LIVE = ["2026-09-12", "2026-09-13", "2026-09-14"]


@pytest.mark.slow
def test_the_champion_rolls_back_after_k_days_worse_than_its_holdout(file_base: str) -> None:
    write_days(file_base, days_ending(B, 5))
    for ds in LIVE:  # the world changed: the clicks the model predicts are the ones not made
        frame = ctr_rows(ds, 300)
        write_partition(file_base, TABLE, ds, frame)
        write_partition(
            file_base, LABELS, ds, frame[["listing_id"]].assign(label=1 - frame["label"])
        )
    deployment = DeploymentSpec(
        rollout_strategy=RolloutStrategy(
            rollout_metric_thresholds=[Metric("holdout_auc", 0.5)],
            regression_tolerance=0.1,
            rollback_after_days=2,
        )
    )
    version, model, t, defs = scoring_defs(
        TRAINERS / "listing_ctr_model", file_base, None, champion=True, deployment=deployment
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    store = blob_store(file_base)
    champion_key = champion_asset_key(model.name)

    def run(key: dg.AssetKey, ds: str | None = None) -> Any:
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )
        assert result.success
        return result

    def live_check(result: Any) -> Any:
        (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == LIVE_CHECK]
        return check

    for ds in (A, B):
        run(dg.AssetKey(["models", model.name]), ds)
        run(champion_key)
    pointer = cp.read_champion(store, model)
    assert pointer is not None and pointer.ds == B

    def score_and_monitor(ds: str) -> None:
        run(table_asset_key(t.table), ds)
        run(monitoring_asset_key(t), ds)

    score_and_monitor(LIVE[0])
    one_day = run(champion_key)
    assert live_check(one_day).passed  # one day worse: not yet K running
    assert "1 monitored day(s) scored by it" in live_check(one_day).description
    assert getattr(cp.read_champion(store, model), "ds", None) == B

    score_and_monitor(LIVE[1])
    rolled = run(champion_key)
    md, check = champion_metadata(rolled), live_check(rolled)
    assert md["moved"] is True and md["ds"] == A
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    for text in (f"rollback by policy: {version}/{B}", f"{LIVE[0]}: realized auc 0.", LIVE[1]):
        assert text in check.description and text in md["reason"]
    restored = cp.read_champion(store, model)
    assert restored is not None and restored.ds == A
    assert restored.why == check.description
    assert restored.retired == (f"{version}/{B}",)
    left = [p for p in cp.history(store, model) if p.ds == B]
    assert left, "the pointer rolled back from is kept in the history"
    # each partition's card beside its artifacts says what the champion decided about it
    base = Path(file_base.removeprefix("file://"), "models", model.name, version)
    card_b, card_a = (base / B / "card.md").read_text(), (base / A / "card.md").read_text()
    assert "**Champion decisions**" in card_b
    assert "became the champion: newest partition passing every gate" in card_b
    assert f"retired (rollback by policy: {version}/{B}" in card_b
    assert f"became the champion: rollback by policy: {version}/{B}" in card_a

    # the next evaluation does not move forward to the retired partition
    stays = champion_metadata(run(champion_key))
    assert (base / B / "card.md").read_text() == card_b  # nothing new decided: nothing added
    assert stays["moved"] is False and stays["ds"] == A
    assert stays["rejected"][B] == {"retired": "retired: rolled back from by policy"}
    # a rollback decided on a champion that no longer serves is refused, not applied to
    # the one serving now (two evaluations at once: the second judged the old champion)
    with pytest.raises(ch.ChampionError) as err:
        by_hand.rollback(store, model, why="late", retire=True, only_from=f"{version}/{B}")
    assert str(err.value) == (
        f"{model.name}'s champion moved to {version}/{A} after {version}/{B} was judged; it "
        "is judged again at its next evaluation"
    )
    assert getattr(cp.read_champion(store, model), "ds", None) == A
    # and the next day is scored by the restored champion
    run(table_asset_key(t.table), LIVE[2])
    rows = instance.fetch_materializations(table_asset_key(t.table), limit=1).records
    assert rows[0].asset_materialization is not None
    assert rows[0].asset_materialization.metadata["model_ds"].value == A


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rollback_after_days": 0, "rollout_metric_thresholds": [Metric("holdout_auc", 0.6)]},
            "rollback_after_days=0 is invalid; expected None (off) or a whole number of days >= 1",
        ),
        (
            {"rollback_after_days": True},
            "rollback_after_days=True is invalid",
        ),
        (
            {"rollback_after_days": 3},
            "rollback_after_days=3 compares the champion's realized threshold metrics with its "
            "holdout values, but rollout_metric_thresholds is empty; declare at least one Metric",
        ),
    ],
)
def test_a_rollback_policy_is_validated_at_declaration(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelSpecError) as err:
        RolloutStrategy(**kwargs)
    assert message in str(err.value)
