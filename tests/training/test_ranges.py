"""A backfill run of many model partitions: on Ray they train together in one job (one
task each); each partition is still its own materialization, manifest and checks, and a
failing partition fails only itself."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    RESUME_RETRY_TAG,
)

from tests.conftest import TRAINERS
from tests.helpers import ctr_rows, days_ending, local, tables_of, write_partition, write_table
from tests.support.training import DS, TABLE, make_model, resources
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.ranges import stored_results
from zipline_dagster.lineage.partitions import daily_partitions
from zipline_dagster.rollout.assets import build_model_checks
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.paths import MANIFEST_NAME
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.assets import build_model_asset

KEY = dg.AssetKey(["models", "listing_ctr_model"])
DAYS = ["2026-08-05", "2026-08-06", "2026-08-07", "2026-08-08", "2026-08-09"]


def run_range(defs: dg.Definitions, instance: dg.DagsterInstance, start: str, end: str) -> Any:
    return defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance,
        tags={ASSET_PARTITION_RANGE_START_TAG: start, ASSET_PARTITION_RANGE_END_TAG: end},
        raise_on_error=False,
    )


def materializations(instance: dg.DagsterInstance, result: Any) -> dict[str, Any]:
    """The model partitions this run materialized, as Dagster recorded them."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=KEY), limit=1000
    ).records
    return {
        r.partition_key: r.asset_materialization
        for r in records
        if r.run_id == result.run_id and r.asset_materialization is not None
    }


def table_with_a_bad_last_day(file_base: str) -> str:
    """The training table up to DAYS[-1], whose data file that day is garbled (the table
    refuses rows whose columns differ, so the file is broken after its commit): only the
    window that reads it (ds 08-09) fails. Publishes the trainer; its version."""
    write_table(file_base, TABLE, days_ending(DAYS[-1], 8), rows=300)
    (broken,) = tables_of(file_base).days(TABLE)[DAYS[-1]].files
    local(broken).write_bytes(b"not a parquet file")
    return publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version


@pytest.mark.ray
def test_range_trains_in_one_ray_job_and_a_failing_partition_fails_only_itself(
    ray_head: Any, file_base: str
) -> None:
    version = table_with_a_bad_last_day(file_base)
    model = make_model(version, file_base)
    defs = dg.Definitions(
        assets=[build_model_asset(model=model)],
        asset_checks=build_model_checks(model, daily_partitions),
        resources=resources(ray_head.dashboard_url, file_base),
    )
    instance = dg.DagsterInstance.ephemeral()

    result = run_range(defs, instance, DAYS[0], DAYS[-1])
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None
    text = failure.message
    assert "1 of 5 partitions of listing_ctr_model failed (4 trained and materialized)" in text
    assert f"- {DAYS[-1]}: its trainer exited with" in text
    assert "Parquet" in text, text  # the trainer's own error: pyarrow's, on the garbled file

    mats = materializations(instance, result)
    assert sorted(mats) == DAYS[:-1]
    store = blob_store(file_base)
    job_ids = set()
    for ds, mat in mats.items():
        md = {k: v.value for k, v in mat.metadata.items()}
        # each partition its own metadata, artifacts and manifest
        assert md["artifact_uri"] == f"{file_base}/models/listing_ctr_model/{version}/{ds}"
        assert md["window"] == f"{days_ending(ds, 4)[0]}..{ds}"
        assert md["range"] == f"{DAYS[0]}..{DAYS[-1]}"
        assert md["holdout/auc"] > 0.5
        assert store.exists(f"{md['artifact_uri']}/{MANIFEST_NAME}")
        # its cost: a fifth of the range job's wall time, its own task's run, CPU and
        # memory (a trainer of xgboost on some thousands of rows: real numbers, not 0)
        assert "one Ray job for 5 partitions" in md["cost/split"]
        assert md["cost/run_s"] > 0 and md["cost/wall_s"] > 0
        assert md["cost/cpu_s"] > 0 and 50 < md["cost/peak_mem_mb"] < 4096
        assert md["cost/rows_per_s"] == pytest.approx(
            (md["train/rows"] + md["holdout/rows"]) / md["cost/run_s"], rel=0.01
        )
        job_ids.add(md["ray_job_id"])
    # one Ray job trained the range
    sid = f"zd-listing_ctr_model-{version}-{DAYS[0]}_{DAYS[-1]}-1"
    assert job_ids == {sid}
    # its driver left every day's result in its end marker on storage, which the step
    # reads: Ray may hand it an incomplete log (on many nodes), never failing a day that
    # trained
    first_dir = f"{file_base}/models/listing_ctr_model/{version}/{DAYS[0]}"
    stored = stored_results(WarehouseResource(uri=file_base), first_dir, sid)
    assert {ds: r["exit_code"] for ds, r in stored.items()} == {
        **{ds: 0 for ds in DAYS[:-1]},
        DAYS[-1]: 1,
    }
    assert "Parquet" in stored[DAYS[-1]]["tail"]
    assert not store.exists(
        f"{file_base}/models/listing_ctr_model/{version}/{DAYS[-1]}/{MANIFEST_NAME}"
    )
    assert instance.get_materialized_partitions(KEY) == set(DAYS[:-1])
    # the step's log names the job's command with its partitions summed up (each one's
    # flags in full would be some 400 characters a partition), in its own line and in
    # Ray's "Running entrypoint" line it forwards
    commands = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if "submitted Ray job" in e.user_message or "Running entrypoint for job" in e.user_message
    ]
    assert len(commands) == 2
    for line in commands:
        assert f"--partitions=<5 partitions, {DAYS[0]}..{DAYS[-1]}, each with" in line
        assert "--start-ds" not in line and len(line) < 1000

    # Mend the day and run the last two partitions: both succeed, and the blocking gates
    # are recorded against each partition of the range.
    write_partition(file_base, TABLE, DAYS[-1], ctr_rows(DAYS[-1], 300))
    result = run_range(defs, instance, DAYS[-2], DAYS[-1])
    assert result.success
    assert sorted(materializations(instance, result)) == DAYS[-2:]
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert sorted((e.partition, e.check_name) for e in evaluations) == sorted(
        (ds, gate)
        for ds in DAYS[-2:]
        for gate in (
            "manifest_verifies",
            "no_regression_vs_champion",
            "report_complete",
            "rollout_thresholds",
        )
    )
    assert all(e.passed and e.target_materialization_data is not None for e in evaluations)
    assert instance.get_materialized_partitions(KEY) == set(DAYS)
    # Dagster notes that the checks step yielded nothing for the range as a whole; the
    # line before it says why that is expected, so a user does not read it as a failure
    said = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    dagster = next(i for i, m in enumerate(said) if "did not yield or return" in m)
    assert "check results recorded against each of the 2 partitions" in said[dagster - 1]


def range_job(base: str, dashboard_url: str, version: str) -> dg.JobDefinition:
    """The model's asset job, built by name (``dg.build_reconstructable_job``) so that
    Dagster can re-execute its runs; in-process, like the tests' other runs."""
    model = make_model(version, base)
    return dg.Definitions(
        assets=[build_model_asset(model=model)],
        asset_checks=build_model_checks(model, daily_partitions),
        jobs=[dg.define_asset_job("train_listing_ctr_model", selection=dg.AssetSelection.all())],
        resources=resources(dashboard_url, base),
        executor=dg.in_process_executor,
    ).resolve_job_def("train_listing_ctr_model")


@pytest.mark.ray
def test_a_retry_from_failure_trains_only_what_failed_or_changed(
    ray_head: Any, file_base: str
) -> None:
    days = DAYS[-3:]  # windows: 08-04..08-07, 08-05..08-08, 08-06..08-09
    version = table_with_a_bad_last_day(file_base)
    job = dg.build_reconstructable_job(
        "tests.training.test_ranges",
        "range_job",
        reconstructable_args=(file_base, ray_head.dashboard_url, version),
    )
    tags = {ASSET_PARTITION_RANGE_START_TAG: days[0], ASSET_PARTITION_RANGE_END_TAG: days[-1]}
    store = blob_store(file_base)

    def manifest(ds: str) -> dict[str, Any]:
        uri = f"{file_base}/models/listing_ctr_model/{version}/{ds}/{MANIFEST_NAME}"
        return json.loads(store.read_bytes(uri))

    with dg.instance_for_test() as instance:
        first = dg.execute_job(job, instance, tags=tags, raise_on_error=False)
        assert not first.success
        trained = materializations(instance, first)
        assert sorted(trained) == days[:2]
        before = {ds: manifest(ds) for ds in days[:2]}
        # Mend the failing day, and write again a day only the first partition reads.
        write_partition(file_base, TABLE, DAYS[-1], ctr_rows(DAYS[-1], 300))
        write_partition(file_base, TABLE, "2026-08-04", ctr_rows("2026-08-04", 300))

        # As the UI's (and the run retry daemon's) "from failure" re-execution runs it: the
        # parent's partition range, tagged a resume retry (execute_job adds neither).
        retry = dg.execute_job(
            job,
            instance,
            tags={**tags, RESUME_RETRY_TAG: "true"},
            reexecution_options=dg.ReexecutionOptions.from_failure(first.run_id, instance),
            raise_on_error=False,
        )
        assert retry.success
        mats = materializations(instance, retry)
        assert sorted(mats) == days  # every partition of the range, for the run's checks
        md = {ds: {k: v.value for k, v in m.metadata.items()} for ds, m in mats.items()}

        # 08-08: trained by the first run, nothing it reads changed: not trained again
        kept = days[1]
        assert md[kept]["reused_from_run"] == first.run_id
        assert md[kept]["attempt"] == before[kept]["attempt"]
        assert md[kept]["holdout/auc"] == trained[kept].metadata["holdout/auc"].value
        assert manifest(kept) == before[kept]  # storage untouched
        # 08-07: its input was written again after it trained; 08-09: it failed
        for ds in (days[0], days[2]):
            assert "reused_from_run" not in md[ds]
            assert md[ds]["attempt"] == manifest(ds)["attempt"]
            assert manifest(ds)["dagster_run_id"] == retry.run_id
        assert manifest(days[0])["attempt"] != before[days[0]]["attempt"]
        # one job trains those two days, named by its span and a hash of its days: never
        # the first run's job for the whole span (a live one would be followed)
        first_job = before[days[0]]["attempt"].removesuffix("-1")
        assert md[days[0]]["attempt"] == md[days[2]]["attempt"]
        assert md[days[0]]["attempt"].startswith(f"{first_job}-")
        assert md[days[0]]["attempt"].endswith("-1")
        # the gates ran for every partition of the range, the reused one included
        evaluations = [
            e.event_specific_data
            for e in retry.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
        ]
        assert {(e.partition, e.check_name) for e in evaluations} >= {
            (ds, "manifest_verifies") for ds in days
        }
        assert all(e.passed for e in evaluations)

        # Re-executing every step of the failed run is a new training: nothing is reused.
        again = dg.execute_job(
            job,
            instance,
            tags=tags,
            reexecution_options=dg.ReexecutionOptions(parent_run_id=retry.run_id),
            raise_on_error=False,
        )
        assert again.success
        assert all(
            "reused_from_run" not in m.metadata for m in materializations(instance, again).values()
        )


def test_what_on_storage_makes_a_retry_train_again(file_base: str) -> None:
    """Each reason, read from the files themselves, that a partition the failed run
    trained (and the ledger finds as Dagster recorded it) is trained again on the retry:
    its manifest incomplete or without a commit time; a window day without a commit time,
    or committed after the model (a write the run's graph does not see)."""
    from zipline_dagster.jobs.request import build_training_request
    from zipline_dagster.storage.paths import join_uri
    from zipline_dagster.storage.table_days import TableDay
    from zipline_dagster.training.retries import why_input_changed

    store = blob_store(file_base)
    request = build_training_request(make_model("a" * 12, file_base), DS, warehouse=file_base)
    manifest_uri = join_uri(request.canonical_dir, MANIFEST_NAME)

    def held(day: str, write: str | None, at: float | None) -> TableDay:
        return TableDay(TABLE, day, (), 0, None, write, at=at)

    scan = {day: held(day, "w", 100.0) for day in request.days}

    def why() -> str | None:
        return why_input_changed(store, request, scan)

    def commit(at: object) -> None:
        manifest = {"dagster_run_id": "run-1", "attempt": "zd-x-1", "committed_at": at}
        store.write_bytes(manifest_uri, json.dumps({**manifest, "files": []}).encode())

    incomplete = f"its manifest in {request.canonical_dir} is not complete or has no commit time"
    assert why() == incomplete
    commit("late")
    assert why() == incomplete
    commit(200)
    assert why() is None  # the model of that run, trained after its input
    first = request.days[0]
    scan[first] = held(first, "w2", 300.0)
    assert why() == f"its input {TABLE} {first} was written after it was trained"
    scan[first] = held(first, None, None)
    assert why() == f"its input {TABLE} {first} has no commit time"
