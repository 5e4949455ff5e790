"""Batch scoring (ModelTransforms) and monitoring on a real local Ray cluster: day ds is
scored by the model of ds-1 from the trainer archive's inference module, re-runs are
bit-identical, retraining a model partition makes exactly the scores it served stale,
and the realized metrics equal an independent pandas/scikit-learn computation."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from tests.conftest import TRAINERS
from tests.helpers import (
    attempt_of,
    copy_run_as_failed,
    ctr_rows,
    days_ending,
    local,
    run_days,
    tables_of,
    write_partition,
)
from tests.support.scoring import (
    D1,
    D2,
    D3,
    LABELS,
    booster_scores,
    champion_metadata,
    scoring_defs,
    transforms_for,
    write_days,
)
from tests.support.training import TABLE, make_model, resources
from zipline_dagster import (
    DeploymentSpec,
    EventSource,
    Metric,
    ModelSpecError,
    ModelTransforms,
    RolloutStrategy,
)
from zipline_dagster.declarations.versions import scores_code_version
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.lineage.backfill import plan_backfill
from zipline_dagster.lineage.freshness import FreshnessResolver
from zipline_dagster.lineage.partitions import (
    champion_asset_key,
    latest_materialization,
    table_asset_key,
)
from zipline_dagster.rollout import by_hand
from zipline_dagster.rollout import champion as ch
from zipline_dagster.scoring.monitoring import monitoring_asset_key
from zipline_dagster.storage.blobs import blob_store


def test_model_transforms_is_validated_at_load() -> None:
    model = make_model("0123456789ab", "file:///tmp/x")
    with pytest.raises(ModelSpecError, match="collides with a column"):
        ModelTransforms(
            sources=[EventSource(TABLE)],
            models=[model],
            passthrough_fields=["score"],
            output_namespace="ctr",
        )
    with pytest.raises(ModelSpecError, match=r"label_keys \['view_id'\] are not passthrough"):
        ModelTransforms(
            sources=[EventSource(TABLE)],
            models=[model],
            passthrough_fields=["listing_id"],
            output_namespace="ctr",
            labels=EventSource(LABELS),
            label_keys=["view_id"],
        )
    other = make_model("0123456789ab", "file:///tmp/x", name="other_model")
    with pytest.raises(ModelSpecError, match="not among the models of these definitions"):
        build_definitions(
            external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
            models=[other],
            transforms=[transforms_for(model)],
            automation=False,
        )


def scoring_setup(
    base: str,
) -> tuple[str, Any, ModelTransforms, dg.Definitions, dg.JobDefinition, Any]:
    """Source and label days up to ``D2`` under ``base``, and ``scoring_defs``' version,
    model, scores table and definitions, with their asset job and asset graph."""
    write_days(base, days_ending(D2, 5))
    version, model, t, defs = scoring_defs(TRAINERS / "listing_ctr_model", base, None)
    job, graph = defs.resolve_implicit_global_asset_job_def(), defs.resolve_asset_graph()
    return version, model, t, defs, job, graph


def run_asset(
    job: dg.JobDefinition, instance: dg.DagsterInstance, key: dg.AssetKey, ds: str | None
) -> dg.ExecuteInProcessResult:
    """One run of ``key`` (partition ``ds``; None: unpartitioned) on ``instance``; a
    failure is in the result, not raised."""
    return job.execute_in_process(
        instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
    )


def failure_message(result: Any) -> str:
    """The message of the one step failure of ``result``, a failed run."""
    assert not result.success
    (failed,) = result.get_step_failure_events()
    return str(failed.step_failure_data.error.message)


def committed_partitions(_store: Any, base: str, table: str) -> dict[str, list[str]]:
    """{ds: its data files} of every committed day of ``table``, from its catalog."""
    return {ds: list(d.files) for ds, d in tables_of(base).days(table).items()}


def read_partition(base: str, table: str, ds: str) -> tuple[list[str], pd.DataFrame]:
    store = blob_store(base)
    files = committed_partitions(store, base, table)[ds]
    frames = [pq.read_table(io.BytesIO(store.read_bytes(f))).to_pandas() for f in files]
    return files, pd.concat(frames, ignore_index=True)


def test_scores_served_by_the_day_before_and_monitored(
    ray_head: Any, file_base: str, trainer_copy: Path
) -> None:
    write_days(file_base, days_ending(D3, 6))
    version, model, t, defs = scoring_defs(trainer_copy, file_base, ray_head.dashboard_url)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    model_key = dg.AssetKey(["models", model.name])
    scores_key = table_asset_key(t.table)

    def run(key: dg.AssetKey, ds: str) -> dg.ExecuteInProcessResult:
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )
        assert result.success, [
            f.step_failure_data.error.to_string()  # type: ignore[union-attr]
            for f in result.get_step_failure_events()
        ]
        return result

    run(model_key, D1)
    run(model_key, D2)
    first = run(scores_key, D2)
    run(scores_key, D3)

    # Day D2 is scored by partition D1 from the archive's trainer.score: exactly the
    # booster's predictions on D2's source rows, with its version and day.
    files, scores = read_partition(file_base, t.table, D2)
    assert list(scores.columns) == [
        "listing_id",
        "score",
        "model_version",
        "model_ds",
        "model_age_days",
        "ds",  # Iceberg's identity partition reads the day from the file
    ]
    _, source = read_partition(file_base, TABLE, D2)
    model_dir = Path(file_base[len("file://") :]) / "models" / model.name / version / D1
    expected = booster_scores(model_dir, source)
    assert scores["listing_id"].tolist() == source["listing_id"].tolist()
    np.testing.assert_array_equal(scores["score"].to_numpy(), expected.astype(np.float64))
    assert set(scores["model_version"]) == {version} and set(scores["model_ds"]) == {D1}
    assert set(scores["model_age_days"]) == {1}
    (mat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in first.get_asset_materialization_events()
    ]
    assert mat.metadata["model_ds"].value == D1 and mat.metadata["rows"].value == 300
    assert mat.metadata["model_age_days"].value == 1
    assert mat.metadata["score_with"].value == "newest_passing"
    assert mat.metadata["scored_by"].value == f"partition {D1} (the day before)"
    _, d3 = read_partition(file_base, t.table, D3)
    assert set(d3["model_ds"]) == {D2}

    # A re-run gives the same bytes (a new file, committed in place of the old one).
    store = blob_store(file_base)
    before = store.read_bytes(files[0])
    run(scores_key, D2)
    files_again, _ = read_partition(file_base, t.table, D2)
    assert files_again != files and store.read_bytes(files_again[0]) == before
    # the replaced file leaves the day; the snapshot before keeps it (time travel)
    assert files[0] not in files_again and store.exists(files[0])

    # Monitoring: realized metrics equal an independent computation.
    monitored = run(monitoring_asset_key(t), D2)
    (mmat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in monitored.get_asset_materialization_events()
    ]
    _, labels = read_partition(file_base, LABELS, D2)
    joined = scores.merge(labels, on="listing_id")
    assert mmat.metadata["rows_joined"].value == 300
    assert mmat.metadata["realized/auc"].value == pytest.approx(
        roc_auc_score(joined["label"], joined["score"]), abs=1e-12
    )
    assert mmat.metadata["realized/logloss"].value == pytest.approx(
        log_loss(joined["label"], joined["score"], labels=[0, 1]), abs=1e-12
    )
    assert mmat.metadata["realized/positive_rate"].value == pytest.approx(joined["label"].mean())
    report = json.loads((model_dir / "metrics.json").read_text())
    assert mmat.metadata["training/holdout_auc"].value == report["holdout"]["metrics"]["auc"]
    # a warning check per realized metric of the task, each against the holdout's
    checks = {c.check_name: c for c in monitored.get_asset_check_evaluations()}
    assert sorted(checks) == ["realized_accuracy", "realized_auc", "realized_logloss"]
    assert checks["realized_auc"].metadata["realized_auc"].value == (
        mmat.metadata["realized/auc"].value
    )
    assert (
        mmat.metadata["training/holdout_logloss"].value == report["holdout"]["metrics"]["logloss"]
    )
    assert mmat.metadata["task"].value == "classification"

    # Retraining model partition D1 makes exactly the scores it served stale.
    graph = defs.resolve_asset_graph()
    fresh = FreshnessResolver(instance, graph)
    assert fresh.status(scores_key, D2).fresh and fresh.status(scores_key, D3).fresh
    run(model_key, D1)
    after = FreshnessResolver(instance, graph)
    assert str(after.status(scores_key, D2)).startswith("stale: upstream models/listing_ctr_model")
    assert after.status(scores_key, D3).fresh


@pytest.mark.slow
def test_a_range_of_days_scores_in_one_ray_job_and_a_failing_day_fails_only_itself(
    launcher: str | None, file_base: str
) -> None:
    """A backfill run of four scores days: on Ray one job scores them (one task a day),
    on the local launcher one run after another; either way each day is its own commit
    and materialization. Day 3's source data file is garbled (its run fails inside the
    job) and day 4's model partition was never trained (it never reaches the job): both
    fail, alone, and are left uncommitted; the others are exactly what a run of their
    own writes."""
    days = days_ending("2026-09-16", 9)  # 09-08 .. 09-16
    trained = days[3:6]  # 09-11 .. 09-13: windows 09-08 .. 09-13
    scored = days[4:8]  # 09-12 .. 09-15, scored by 09-11 .. 09-14
    bad = scored[2]  # 09-14: scored by 09-13 (trained), its own rows unreadable
    for ds in days:
        rows = ctr_rows(ds, 200)
        write_partition(file_base, LABELS, ds, rows[["listing_id", "label"]])
        write_partition(file_base, TABLE, ds, rows)
    (broken,) = tables_of(file_base).days(TABLE)[bad].files  # its data file, garbled
    local(broken).write_bytes(b"not a parquet file")
    _, model, t, defs = scoring_defs(TRAINERS / "listing_ctr_model", file_base, launcher)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    scores_key = table_asset_key(t.table)

    def run(key: dg.AssetKey, first: str, last: str) -> dg.ExecuteInProcessResult:
        return run_days(job, instance, key, first, last)

    assert run(dg.AssetKey(["models", model.name]), trained[0], trained[-1]).success
    result = run(scores_key, scored[0], scored[-1])
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error is not None and error.cls_name == "Failure"
    text = error.message
    assert f"2 of 4 partitions of {t.table} failed (2 scored and materialized)" in text
    if launcher is not None:  # a task of the range's job
        assert f"- {bad}: its inference module exited with 1 in Ray job zd-score-" in text
    else:  # a run of its own
        # exit code 1 (the module's uncaught error), or rarely -6: once, in CI, a C++
        # runtime aborted at the failing interpreter's exit ("terminate called without an
        # active exception"); the day fails alone with the module's own error either way
        assert f"- {bad}: local trainer local-score-" in text
        assert re.search(r"FAILED \(exit code (1|-6)\)", text), text
    assert "Parquet" in text, text  # the module's own error: pyarrow's, on the garbled file
    assert f"- {scored[3]}: {t.table} {scored[3]} is scored by {model.name} partition" in text

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=scores_key), limit=100
    ).records
    mats = {
        r.partition_key: {k: v.value for k, v in r.asset_materialization.metadata.items()}
        for r in records
        if r.run_id == result.run_id and r.asset_materialization is not None
    }
    assert sorted(mats) == scored[:2]
    assert instance.get_materialized_partitions(scores_key) == set(scored[:2])
    store = blob_store(file_base)
    committed = committed_partitions(store, file_base, t.table)
    assert sorted(committed) == scored[:2]  # the failed days are left uncommitted
    for ds in scored[:2]:
        md = mats[ds]
        assert md["model_ds"] == days[days.index(ds) - 1] and md["rows"] == 200
        assert committed[ds] == [md["uri"]]
        _, frame = read_partition(file_base, t.table, ds)
        assert md["score_mean"] == pytest.approx(frame["score"].mean())
        assert md["score_p50"] == pytest.approx(frame["score"].median())
        assert md["cost/cpu_s"] > 0 and md["cost/wall_s"] > 0 and md["cost/peak_mem_mb"] > 0
        assert md["cost/rows_per_s"] == pytest.approx(200 / md["cost/run_s"], rel=0.01)
    # the job's end marker (a Ray job writes it for its first day) went with the commit
    assert store.list(f"{file_base}/ctr/listing_ctr_model_scores/_jobs/ds={scored[0]}") == []
    job_ids = {mats[ds]["job_id"] for ds in scored[:2]}
    if launcher is not None:  # one Ray job scored the days that reached it
        (sid,) = job_ids
        assert sid.startswith(f"zd-score-ctr-listing_ctr_model_scores-{scored[0]}_{bad}-")
        assert all(mats[ds]["range"] == f"{scored[0]}..{bad}" for ds in scored[:2])
    else:
        assert len(job_ids) == 2

    # A day scored in the range holds exactly the bytes a run of its own writes.
    in_range = store.read_bytes(committed[scored[0]][0])
    assert run(scores_key, scored[0], scored[0]).success
    (alone,) = committed_partitions(store, file_base, t.table)[scored[0]]
    assert alone != committed[scored[0]][0] and store.read_bytes(alone) == in_range

    # Monitoring a range is one run too: each day its own materialization and check
    # result; a day whose scores were never committed fails alone, naming itself.
    monitoring = monitoring_asset_key(t)
    partly = run(monitoring, scored[0], scored[2])
    assert not partly.success
    text = partly.get_step_failure_events()[0].step_failure_data.error.message  # type: ignore[union-attr]
    assert f"1 of 3 partitions of {monitoring.to_user_string()} failed (2 monitored" in text
    assert f"- {bad}: cannot monitor {t.table} {bad}: {t.table} partition {bad} is missing" in text
    assert instance.get_materialized_partitions(monitoring) == set(scored[:2])
    whole = run(monitoring, scored[0], scored[1])
    assert whole.success
    realized = {
        r.partition_key: {k: v.value for k, v in r.asset_materialization.metadata.items()}
        for r in instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=monitoring), limit=100
        ).records
        if r.run_id == whole.run_id and r.asset_materialization is not None
    }
    assert sorted(realized) == scored[:2]
    checks = {
        e.partition: e
        for e in whole.get_asset_check_evaluations()
        if e.check_name == "realized_auc"
    }
    assert sorted(checks) == scored[:2]
    for ds in scored[:2]:
        _, frame = read_partition(file_base, t.table, ds)
        _, labels = read_partition(file_base, LABELS, ds)
        joined = frame.merge(labels, on="listing_id")
        assert realized[ds]["rows_joined"] == len(joined) == 200
        assert realized[ds]["realized/auc"] == pytest.approx(
            roc_auc_score(joined["label"], joined["score"]), abs=1e-12
        )
        assert checks[ds].metadata["realized_auc"].value == realized[ds]["realized/auc"]


def test_a_scores_file_that_cannot_be_read_is_never_committed(
    file_base: str, trainer_copy: Path
) -> None:
    """An inference module that exits 0 but writes something that is not parquet: the
    step fails naming the file, and the day stays as it was (not committed, not
    materialized). Local launcher: the commit is the platform's, whichever runs the job."""
    # the trainer's inference module: the runtime's scorer, then its file overwritten
    (trainer_copy / "trainer" / "score.py").write_text(
        "from zipline_runtime import trainer_io as tio\n"
        "from zipline_runtime.score import score\n\n"
        "uri = score()['uri']\n"
        "tio.write_bytes(uri.rsplit('/', 1)[0], uri.rsplit('/', 1)[1], b'not a parquet file')\n"
    )
    for ds in days_ending(D2, 5):
        write_partition(file_base, TABLE, ds, ctr_rows(ds, 200))
    _, model, t, defs = scoring_defs(trainer_copy, file_base, None)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    trained = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(["models", model.name])], partition_key=D1
    )
    assert trained.success
    result = job.execute_in_process(
        instance=instance,
        asset_selection=[table_asset_key(t.table)],
        partition_key=D2,
        raise_on_error=False,
    )
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error is not None and error.cls_name == "Failure"
    assert f"{t.table} {D2}: the scoring job local-" in error.message
    assert "which cannot be read" in error.message and "left as it was" in error.message
    assert D2 not in committed_partitions(blob_store(file_base), file_base, t.table)
    assert instance.get_materialized_partitions(table_asset_key(t.table)) == set()


def latest_metadata(instance: dg.DagsterInstance, key: dg.AssetKey, ds: str) -> dict[str, Any]:
    """The metadata of the latest materialization of ``key`` partition ``ds``."""
    record = latest_materialization(instance, key, ds)
    assert record is not None and record.asset_materialization is not None
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


@pytest.mark.slow
def test_a_model_dagster_never_recorded_is_recorded_from_storage_and_served(
    file_base: str,
) -> None:
    """A run stopped after it promoted its model and before Dagster recorded it (a kill -9
    in between) leaves storage ahead of Dagster: the partition's folder holds an attempt
    that no materialization describes. That state is made here by a real second run of
    the partition recorded on another instance, which ours never sees (a kill cannot be
    timed into that window). Storage is the truth: scoring records the model into Dagster
    from storage (saying so, with its gates evaluated) and serves it; the planner then
    finds it fresh and the champion judges it, pinning that attempt."""
    version, model, t, _, job, graph = scoring_setup(file_base)
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    model_key, scores_key = dg.AssetKey(["models", model.name]), table_asset_key(t.table)
    manifest = Path(
        file_base[len("file://") :], "models", model.name, version, D1, "_MANIFEST.json"
    )

    run = functools.partial(run_asset, job)

    first = run(ours, model_key, D1)
    assert first.success and json.loads(manifest.read_text())["attempt"] == attempt_of(first)
    other = run(elsewhere, model_key, D1)
    assert other.success
    held, recorded = attempt_of(other), attempt_of(first)
    assert held != recorded and json.loads(manifest.read_text())["attempt"] == held

    scored = run(ours, scores_key, D2)
    assert scored.success
    why = (
        f"storage holds attempt {held}, committed by run {other.run_id}, which ended without "
        f"recording it (Dagster had attempt {recorded} (run {first.run_id})): recorded from "
        "storage"
    )
    said = [e.user_message for e in ours.all_logs(scored.run_id)]
    assert f"{model.name} partition {D1}: {why}" in said
    md = latest_metadata(ours, model_key, D1)
    assert md["attempt"] == held and md["zipline/recorded_from_storage"] == why
    # its gates were evaluated with it (the blocking ones passed: no thresholds declared)
    gates = [dg.AssetCheckKey(model_key, n) for n in ("report_complete", "manifest_verifies")]
    executions = ours.event_log_storage.get_latest_asset_check_execution_by_key(gates)
    assert {k.name: (r.status.value, r.run_id) for k, r in executions.items()} == {
        "report_complete": ("SUCCEEDED", ""),  # reported outside a run
        "manifest_verifies": ("SUCCEEDED", ""),
    }
    assert D2 in committed_partitions(blob_store(file_base), file_base, t.table)
    assert FreshnessResolver(ours, graph).status(model_key, D1).fresh
    moves = champion_metadata(run(ours, champion_asset_key(model.name), None))
    assert moves["moved"] is True and moves["pointer"]["attempt"] == held


def test_a_model_its_own_run_never_recorded_is_recorded_from_storage(file_base: str) -> None:
    """A run of this instance promoted its model and ended without recording it (killed
    between the two): Dagster has no materialization of the partition at all, yet storage
    holds a finished model. The planner records it from storage, naming the run and its
    status, and finds it fresh; scoring serves it. While that run is still going, it is
    left to it: scoring refuses it and the champion passes it over, naming the run. The
    state is made with a real run recorded on another instance whose run record (not its
    materialization) is copied into ours: what a kill -9 in that window leaves, which a
    kill cannot be timed into."""
    _, model, t, _, job, graph = scoring_setup(file_base)
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    going = dg.DagsterInstance.ephemeral()
    model_key, scores_key = dg.AssetKey(["models", model.name]), table_asset_key(t.table)

    run = functools.partial(run_asset, job)

    other = run(elsewhere, model_key, D1)
    assert other.success
    held = attempt_of(other)

    # the run still going (its record, started): left to it
    copy_run_as_failed(elsewhere, going, other.run_id, dg.DagsterRunStatus.STARTED)
    in_flight = (
        f"storage holds attempt {held}, committed by run {other.run_id} (STARTED), which has "
        "not recorded it yet"
    )
    refused = failure_message(run(going, scores_key, D2))
    assert (
        f"{t.table} {D2} is scored by {model.name} partition {D1}, but {in_flight}: score it "
        "once that run has ended"
    ) in refused
    assert D2 not in committed_partitions(blob_store(file_base), file_base, t.table)
    stays = champion_metadata(run(going, champion_asset_key(model.name), None))
    assert stays["moved"] is False
    assert stays["rejected"] == {D1: {"recorded_by_dagster": in_flight}}

    # the run ended (failed) without recording it: recorded from storage
    copy_run_as_failed(elsewhere, ours, other.run_id)
    resolver = FreshnessResolver(ours, graph)
    assert resolver.status(model_key, D1).fresh
    assert [d.describe() for d in resolver.ledger.recorded] == [
        f"storage holds attempt {held}, committed by run {other.run_id} (FAILURE), which "
        "ended without recording it (Dagster had no materialization): recorded from storage"
    ]
    assert latest_metadata(ours, model_key, D1)["attempt"] == held
    assert run(ours, scores_key, D2).success
    _, scores = read_partition(file_base, t.table, D2)
    assert set(scores["model_ds"]) == {D1}
    moves = champion_metadata(run(ours, champion_asset_key(model.name), None))
    assert moves["moved"] is True and moves["pointer"]["attempt"] == held


def test_scores_storage_holds_but_dagster_never_recorded_are_recorded_from_storage(
    file_base: str,
) -> None:
    """A scores day committed by a run that Dagster never recorded (stopped between its
    commit and its record): the planner records it from storage (its marker names the
    write and the run), so only the day's monitoring is planned, and monitoring it reads
    those scores; a day whose files are gone from storage is missing to the planner. The
    unrecorded commit is made by a real run on another instance."""
    _, model, t, defs, job, graph = scoring_setup(file_base)
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    model_key, scores_key = dg.AssetKey(["models", model.name]), table_asset_key(t.table)
    run = functools.partial(run_asset, job)

    assert run(ours, model_key, D1).success
    scored = run(ours, scores_key, D2)
    (event,) = scored.get_asset_materialization_events()
    recorded = event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
    write = str(recorded["write_id"].value)
    assert write == recorded["job_id"].value
    assert FreshnessResolver(ours, graph).status(scores_key, D2).fresh

    again = run(elsewhere, scores_key, D2)
    assert again.success
    stored = tables_of(file_base).days(t.table)[D2]
    held = stored.write
    assert held != write and stored.run_id == again.run_id
    assert stored.code_version == scores_code_version(t)

    plan = plan_backfill(defs, ours, monitoring_asset_key(t), [D2])
    assert plan.steps == [(monitoring_asset_key(t), [D2])]
    md = latest_metadata(ours, scores_key, D2)
    # the Iceberg table is named: where the planner reads the day's snapshot
    assert md["dagster/table_name"] == t.table == recorded["dagster/table_name"].value
    assert md["write_id"] == held and md["zipline/recorded_from_storage"] == (
        f"storage holds write {held}, committed by run {again.run_id}, which ended without "
        f"recording it (Dagster had write {write} (run {scored.run_id})): recorded from storage"
    )
    assert FreshnessResolver(ours, graph).status(scores_key, D2).fresh
    monitored = run(ours, monitoring_asset_key(t), D2)
    assert monitored.success

    tables_of(file_base).load(t.table).delete(f"ds = '{D2}'")  # another engine removes it
    assert str(FreshnessResolver(ours, graph).status(scores_key, D2)) == (
        f"stale: it is not committed on storage (no committed {t.table} {D2})"
    )


@pytest.mark.slow
def test_scoring_by_the_champion_serves_only_the_attempt_its_gates_judged(
    file_base: str,
) -> None:
    """The champion pins the attempt its gates judged. Its partition trained again holds
    another attempt, never judged: scoring by the champion refuses it (naming both), the
    champion asset judges the partition again and pins the new attempt, and a rollback to
    the pointer that named the old attempt is refused, since storage no longer holds it."""
    write_days(file_base, days_ending(D2, 5))
    gated = DeploymentSpec(
        rollout_strategy=RolloutStrategy(rollout_metric_thresholds=[Metric("holdout_auc", 0.5)])
    )
    version, model, t, defs = scoring_defs(
        TRAINERS / "listing_ctr_model", file_base, None, champion=True, deployment=gated
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    store = blob_store(file_base)

    def run(key: dg.AssetKey, ds: str | None = None) -> Any:
        return job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=ds, raise_on_error=False
        )

    model_key, scores_key = dg.AssetKey(["models", model.name]), table_asset_key(t.table)
    judged = attempt_of(run(model_key, D1))
    assert run(champion_asset_key(model.name)).success
    pointer = ch.read_champion(store, model)
    assert pointer is not None and (pointer.ds, pointer.attempt) == (D1, judged)
    assert run(scores_key, D2).success
    files, scores = read_partition(file_base, t.table, D2)
    assert set(scores["model_ds"]) == {D1}

    retrained = attempt_of(run(model_key, D1))
    refused = failure_message(run(scores_key, D2))
    assert (
        f"but {version}/{D1} was trained again after it became champion: it holds attempt "
        f"{retrained}, not the attempt {judged} that was judged"
    ) in refused
    assert read_partition(file_base, t.table, D2)[0] == files  # the served scores stand

    moved = champion_metadata(run(champion_asset_key(model.name)))
    assert moved["moved"] is True
    assert f"trained again: attempt {retrained} judged" in moved["reason"]
    assert getattr(ch.read_champion(store, model), "attempt", None) == retrained
    assert run(scores_key, D2).success

    with pytest.raises(ch.ChampionError) as err:
        by_hand.rollback(store, model)
    assert str(err.value) == (
        f"cannot roll {model.name} back: {version}/{D1} was trained again after it became "
        f"champion: it holds attempt {retrained}, not the attempt {judged} that was judged. "
        f"Promote it by hand (`zipline-dagster promote {model.name} --ds {D1} --version "
        f"{version}`) to judge what it holds now"
    )
    assert getattr(ch.read_champion(store, model), "attempt", None) == retrained

    # Trained again on a holdout day of one class, the partition has no holdout AUC and
    # fails its threshold: the champion stays, saying what its partition holds now did not
    # pass, and scoring by it is refused.
    write_partition(file_base, TABLE, D1, ctr_rows(D1, 300, label=0))
    worse = attempt_of(run(model_key, D1))
    stays = champion_metadata(run(champion_asset_key(model.name)))
    assert stays["moved"] is False and stays["reason"] == (
        f"stays at {version}/{D1}: no newer partition passes every gate; but {version}/{D1} "
        f"was trained again after it became champion: it holds attempt {worse}, not the "
        f"attempt {retrained} that was judged, and what it holds now did not pass: scoring "
        "by the champion refuses it until a partition passes or one is promoted by hand"
    )
    assert stays["rejected"][D1]["rollout_thresholds"].startswith("holdout_auc")
    assert not run(scores_key, D2).success
    # between a promotion's move of the old manifest and its new one, or once deleted
    Path(file_base[len("file://") :], "models", model.name, version, D1, "_MANIFEST.json").unlink()
    serving = ch.read_champion(store, model)
    assert serving is not None
    assert ch.why_pinned_attempt_gone(store, serving) == (
        f"{version}/{D1} was trained again after it became champion: it holds no finished "
        "model (no manifest: it is being trained again, or was deleted), not the attempt "
        f"{retrained} that was judged"
    )


@pytest.mark.slow
def test_a_day_is_scored_by_the_newest_partition_passing_its_gates(file_base: str) -> None:
    """By default day ds is scored by the newest model partition at or before ds-1 whose
    blocking gates pass: a day-before partition that fails them is passed over (rows and
    metadata name the partition used and its age); under a threshold no partition meets,
    the day fails naming the failed gates and nothing is committed; scoring with ds-1
    whatever its gates said is a declared choice, and the metadata says so."""
    d0 = days_ending(D1, 2)[0]
    write_days(file_base, days_ending(D2, 6))
    # D1's labels are all 0: the partition of D1 holds that day out, has no holdout AUC
    # and fails its threshold; the partition of d0 passes it.
    write_partition(file_base, TABLE, D1, ctr_rows(D1, 300, label=0))
    lenient = DeploymentSpec(
        rollout_strategy=RolloutStrategy(rollout_metric_thresholds=[Metric("holdout_auc", 0.5)])
    )
    _, model, t, defs = scoring_defs(
        TRAINERS / "listing_ctr_model", file_base, None, deployment=lenient
    )
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    model_key, scores_key = dg.AssetKey(["models", model.name]), table_asset_key(t.table)
    run = functools.partial(run_asset, job, instance)

    assert run(model_key, d0).success
    failing = run(model_key, D1)  # its blocking threshold check fails the run
    (threshold,) = [
        e for e in failing.get_asset_check_evaluations() if e.check_name == "rollout_thresholds"
    ]
    assert not threshold.passed
    gate = str(threshold.metadata["summary"].value)
    assert gate.startswith("holdout_auc is missing")

    scored = run(scores_key, D2)
    assert scored.success
    _, scores = read_partition(file_base, t.table, D2)
    assert set(scores["model_ds"]) == {d0} and set(scores["model_age_days"]) == {2}
    md = champion_metadata(scored)
    assert md["model_ds"] == d0 and md["model_age_days"] == 2
    assert md["scored_by"] == (
        f"partition {d0}, the newest at or before {D1} passing its blocking gates "
        f"({D1} fails rollout_thresholds: {gate})"
    )
    # the day's lineage follows the partition that scored it, not only ds-1: retraining
    # d0 makes D2's scores stale, and a backfill of them plans the day again
    resolver = lambda: FreshnessResolver(instance, defs.resolve_asset_graph())  # noqa: E731
    assert resolver().status(scores_key, D2).fresh
    assert run(model_key, d0).success
    assert str(resolver().status(scores_key, D2)) == (
        f"stale: upstream models/{model.name} {d0} was updated after it"
    )
    assert run(scores_key, D2).success  # scored again, by the retrained d0
    assert resolver().status(scores_key, D2).fresh

    # A threshold no partition meets: no day is scored by a failing partition.
    impossible = DeploymentSpec(
        rollout_strategy=RolloutStrategy(rollout_metric_thresholds=[Metric("holdout_auc", 0.99)])
    )
    strict = dataclasses.replace(model, deployment_conf=impossible)
    strict_defs = build_definitions(
        external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
        models=[strict],
        transforms=[dataclasses.replace(t, models=[strict])],
        resources=resources(None, file_base),
        automation=False,
    )
    strict_job = strict_defs.resolve_implicit_global_asset_job_def()
    before = committed_partitions(blob_store(file_base), file_base, t.table)[D2]
    refused = failure_message(run_asset(strict_job, instance, scores_key, D2))
    assert (
        f"{t.table} {D2}: no partition of {model.name} {model.version} at or before {D1} "
        f"passes its blocking gates, so none scores it: {D1} fails rollout_thresholds: {gate}"
        "; the 1 older trained partition(s) fail too."
    ) in refused
    assert "score_with='day_before'" in refused
    assert committed_partitions(blob_store(file_base), file_base, t.table)[D2] == before

    # Declared, for evaluation: the day before whatever its gates said, and said so.
    evaluation = build_definitions(
        external_tables=[ExternalTable(TABLE), ExternalTable(LABELS)],
        models=[strict],
        transforms=[dataclasses.replace(t, models=[strict], score_with="day_before")],
        resources=resources(None, file_base),
        automation=False,
    )
    ungated = run_asset(
        evaluation.resolve_implicit_global_asset_job_def(), instance, scores_key, D2
    )
    assert ungated.success
    md = champion_metadata(ungated)
    assert md["model_ds"] == D1 and md["score_with"] == "day_before"
    assert md["scored_by"] == (
        f"partition {D1} (the day before), whatever its gates said (declared "
        "score_with='day_before', for evaluation)"
    )
    _, scores = read_partition(file_base, t.table, D2)
    assert set(scores["model_ds"]) == {D1}


def test_score_with_is_validated_at_load() -> None:
    model = make_model("0123456789ab", "file:///tmp/x")
    with pytest.raises(ModelSpecError, match=r"score_with='latest' is invalid; expected one of"):
        dataclasses.replace(transforms_for(model), score_with="latest")
