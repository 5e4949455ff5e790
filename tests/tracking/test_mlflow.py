"""The MLflow hand-off against a real ``mlflow server`` (SQLite store, local artifact root):
model partitions trained through Dagster (the local launcher: MLflow does not care where
a trainer ran), their gates, the champion asset and the CLI's promote and rollback. The
faults are a real socket: a loopback TCP proxy in front of the server, stalled or cut."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_cli
from tests.helpers import ctr_rows, days_ending, run_days, write_partition, write_table
from tests.support.champion import advance, train
from tests.support.training import TABLE, make_model, resources
from tests.tcp_proxy import TcpProxy
from zipline_dagster import DeploymentSpec, Metric, RolloutStrategy
from zipline_dagster.declarations.model import Model
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.lineage.partitions import (
    daily_partitions,
    latest_materialization,
    model_asset_key,
)
from zipline_dagster.rollout.assets import build_champion_asset, build_model_checks
from zipline_dagster.storage.artifacts import read_report, report_metrics
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.manifests import manifest_attempt
from zipline_dagster.storage.paths import model_partition_uri
from zipline_dagster.tracking import IDENTITY_TAG, MlflowResource, Partition
from zipline_dagster.training.assets import build_model_asset

DS1, DS2, DS3 = "2026-08-10", "2026-08-11", "2026-08-12"
DAGSTER_URL = "http://dagster.example:3000"


def gated_model(name: str, trainer: Path, base: str) -> Model:
    version = publish_trainer_archive(trainer, model_name=name, base=base).version
    return dataclasses.replace(
        make_model(version, base, name=name),
        deployment_conf=DeploymentSpec(
            rollout_strategy=RolloutStrategy(
                rollout_metric_thresholds=[Metric("holdout_auc", 0.62)], regression_tolerance=0.1
            )
        ),
    )


def tracked(base: str, uri: str, ray: str | None = None, **fields: Any) -> dict[str, Any]:
    mlflow = MlflowResource(tracking_uri=uri, dagster_url=DAGSTER_URL, **fields)
    return {**resources(ray, base), "mlflow": mlflow}


def runs_by_day(client: MlflowClient, model: Model) -> dict[str, Any]:
    exp = client.get_experiment_by_name(model.name)
    assert exp is not None, f"no experiment named {model.name}"
    runs = client.search_runs([exp.experiment_id])
    by_day = {r.data.tags["zipline.partition"]: r for r in runs}
    assert len(by_day) == len(runs), "a partition attempt was logged twice"
    return by_day


def materialization_metadata(result: Any) -> dict[str, Any]:
    (event,) = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.event_specific_data.materialization.metadata.items()}


def warnings_of(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.level == logging.WARNING]


@pytest.mark.ray
def test_every_partition_is_one_run_and_the_champion_the_registrys_alias(
    mlflow_server: Any, ray_head: Any, file_base: str, trainer_copy: Path, tmp_path: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS3, 6), rows=400)
    noisy = ctr_rows(DS2, 400)  # DS2 holds out shuffled labels: it fails its threshold
    noisy["label"] = np.random.default_rng(7).permutation(noisy["label"].to_numpy())
    write_partition(file_base, TABLE, DS2, noisy)
    model = gated_model("mlflow_ctr_model", trainer_copy, file_base)
    res = tracked(file_base, mlflow_server.url, ray_head.dashboard_url)
    instance = dg.DagsterInstance.ephemeral()
    store = blob_store(file_base)
    # the three days as one range: one Ray job, one attempt, three partitions
    defs = dg.Definitions(
        assets=[build_model_asset(model=model)],
        asset_checks=build_model_checks(model, daily_partitions),
        resources=res,
    )
    key = model_asset_key(model.name)
    ranged = run_days(defs.resolve_implicit_global_asset_job_def(), instance, key, DS1, DS3)
    assert ranged.success
    champion = advance(model, res, instance)
    assert champion["ds"] == DS3

    client = MlflowClient(mlflow_server.url)
    runs = runs_by_day(client, model)
    assert sorted(runs) == [DS1, DS2, DS3]
    for ds in (DS1, DS2, DS3):
        run, model_dir = runs[ds], model_partition_uri(model, ds)
        report = read_report(store, model_dir)
        expected = {k: v for k, v in report_metrics(report).items() if v is not None}
        assert run.data.metrics == expected and "holdout_auc" in expected
        tags = run.data.tags
        assert tags["zipline.asset_key"] == f"models/{model.name}"
        assert tags["zipline.version"] == model.version
        assert tags["zipline.attempt"] == manifest_attempt(store, model_dir)
        assert tags["zipline.dagster_run_id"] == ranged.run_id
        assert tags["zipline.dagster_run_url"] == f"{DAGSTER_URL}/runs/{ranged.run_id}"
        assert tags["zipline.artifact_uri"] == model_dir
        # the trainer's flags, platform-owned and job_configs
        params = run.data.params
        assert params["end-ds"] == ds and params["label-column"] == "label"
        assert params["input-table"] == TABLE and params["model-dir"].startswith(model_dir)
        # the report as an artifact, the model as a reference (nothing copied)
        files = {f.path for f in client.list_artifacts(run.info.run_id, "model")}
        assert files == {"model/zipline_reference.json"}
        logged = json.loads(
            Path(client.download_artifacts(run.info.run_id, "report/metrics.json")).read_text()
        )
        assert logged == report
        # the partition's materialization links to its run
        mat = latest_materialization(instance, key, ds)
        assert mat is not None and mat.asset_materialization is not None
        link = mat.asset_materialization.metadata["mlflow_run"].value
        assert link.endswith(f"/runs/{run.info.run_id}") and link.startswith(mlflow_server.url)
    assert runs[DS1].data.tags["zipline.gates"] == "passed"
    assert runs[DS2].data.tags["zipline.gates"] == "failed: rollout_thresholds"
    assert runs[DS2].data.tags["zipline.gate.rollout_thresholds"].startswith("failed: holdout_auc=")

    # the registry: one model, a version for the champion's partition, @champion on it
    on = client.get_model_version_by_alias(model.name, "champion")
    assert on.tags["zipline.partition"] == DS3 and on.run_id == runs[DS3].info.run_id
    assert on.source == f"runs:/{on.run_id}/model"  # a file:// model: its reference
    assert on.tags["zipline.artifact_uri"] == model_partition_uri(model, DS3)
    assert champion["mlflow_model_version"].endswith(f"/models/{model.name}/versions/{on.version}")

    # evaluating again logs nothing new
    advance(model, res, instance)
    assert sorted(runs_by_day(client, model)) == [DS1, DS2, DS3]
    # a run its gates step never tagged (it failed, or MLflow was down by then) is judged
    # by the next evaluation
    client.delete_tag(runs[DS2].info.run_id, "zipline.gates")
    advance(model, res, instance)
    assert client.get_run(runs[DS2].info.run_id).data.tags["zipline.gates"] == (
        "failed: rollout_thresholds"
    )
    assert sorted(runs_by_day(client, model)) == [DS1, DS2, DS3]

    # promote and rollback move the alias with our pointer, MLflow being the code
    # location's (configured in code, nothing in the environment)
    module = tmp_path / "mlflow_defs.py"
    module.write_text(
        "from tests.tracking.test_mlflow import gated_model\n"
        "from zipline_dagster.definitions import ExternalTable, build_definitions\n"
        "from zipline_dagster.tracking import MlflowResource\n"
        f"model = gated_model({model.name!r}, __import__('pathlib').Path({str(trainer_copy)!r}), "
        f"{file_base!r})\n"
        f"defs = build_definitions(external_tables=[ExternalTable({TABLE!r})], models=[model], "
        f"automation=False, resources={{'mlflow': MlflowResource(tracking_uri={mlflow_server.url!r})}})\n"
    )
    env = {"PYTHONPATH": f"{Path.cwd()}:{tmp_path}", "MLFLOW_TRACKING_URI": ""}
    cli = ("--module", "mlflow_defs")
    promoted = run_cli("promote", model.name, "--ds", DS1, *cli, env=env)
    assert promoted.returncode == 0, promoted.stderr
    ds1 = client.get_model_version_by_alias(model.name, "champion")
    assert ds1.tags["zipline.partition"] == DS1 and ds1.version != on.version
    assert f"MLflow: {model.name}@champion -> version {ds1.version}" in promoted.stderr
    rolled = run_cli("rollback", model.name, *cli, env=env)
    assert rolled.returncode == 0, rolled.stderr
    assert client.get_model_version_by_alias(model.name, "champion").version == on.version

    # our pointer is the truth: an alias moved by hand in MLflow is put back, with a warning
    client.set_registered_model_alias(model.name, "champion", ds1.version)
    result = dg.materialize(
        [build_champion_asset(model)], resources=res, instance=instance, raise_on_error=False
    )
    assert result.success
    assert client.get_model_version_by_alias(model.name, "champion").version == on.version
    put_back = [w for w in warnings_of(instance, result.run_id) if "put back" in w]
    assert put_back == [
        f"MLflow's alias {model.name}@champion was on version {ds1.version} (partition {DS1}), "
        f"not on the champion {model.version}/{DS3}: put back on version {on.version}"
    ]
    versions = client.search_model_versions(f"name = '{model.name}'")
    assert sorted(v.tags["zipline.partition"] for v in versions) == [DS1, DS3]
    assert sorted(runs_by_day(client, model)) == [DS1, DS2, DS3]


@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_a_tracking_server_that_fails_never_fails_training_and_what_it_missed_is_logged_later(
    fault: str,
    mlflow_server: Any,
    file_base: str,
    trainer_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_table(file_base, TABLE, days_ending(DS2, 5), rows=400)
    model = gated_model(f"mlflow_{fault}_model", trainer_copy, file_base)
    proxy = TcpProxy("127.0.0.1", mlflow_server.port)
    res = tracked(file_base, proxy.url, timeout_s=2.0, copy_artifacts=True)
    instance = dg.DagsterInstance.ephemeral()
    store = blob_store(file_base)
    try:
        # stalled: connections accepted and never answered; cut: every one reset
        proxy.stall() if fault == "stall" else proxy.cut()
        results, champion = [], {}
        for ds in (DS1, DS2):
            results.append(train(model, res, ds, instance))
            # MLflow still down: the champion moves to each day, DS1 then DS2
            champion = advance(model, res, instance)
            assert champion["ds"] == ds and "mlflow_model_version" not in champion
        for result in results:
            assert result.success  # trained, checked and committed; MLflow skipped
            assert "mlflow_run" not in materialization_metadata(result)
            skipped = {
                e.step_key: e.user_message
                for e in instance.all_logs(result.run_id)
                if e.level == logging.WARNING and "skipped" in e.user_message
            }
            # one wait a step (training, then its gates): once MLflow failed, the step's
            # later calls skip it
            assert sorted(skipped) == [f"{model.name}_rollout_gates", f"models__{model.name}"]
            why = "no answer within 2s" if fault == "stall" else "failed with exception"
            for text in skipped.values():
                assert why in text and "champion's next evaluation" in text, text
        proxy.restore()
        # back up: a call gets the default's room (a loaded machine answers slower than 2s)
        res = tracked(file_base, proxy.url, copy_artifacts=True)
        # the calls the steps gave up on are answered now; the work they were part of
        # goes no further (it would complete runs beside the ones logged from storage)
        time.sleep(3)
        client = MlflowClient(mlflow_server.url)
        exp = client.get_experiment_by_name(model.name)
        done = (
            client.search_runs([exp.experiment_id], f"tags.`{IDENTITY_TAG}` != ''")
            if exp is not None
            else []
        )
        assert not done, [r.data.tags for r in done]

        # the next evaluation logs both partitions from storage, judged by their gates
        again = dg.materialize([build_champion_asset(model)], resources=res, instance=instance)
        # requests the proxy held reach the server once it is restored, their answers
        # lost: runs left incomplete, deleted by an evaluation once the attempt has a run
        dg.materialize([build_champion_asset(model)], resources=res, instance=instance)
        client = MlflowClient(mlflow_server.url)
        runs = runs_by_day(client, model)
        assert sorted(runs) == [DS1, DS2]
        assert {r.info.status for r in runs.values()} == {"FINISHED"}
        for ds, result in zip((DS1, DS2), results, strict=True):
            tags = runs[ds].data.tags
            assert tags["zipline.dagster_run_id"] == result.run_id
            assert tags["zipline.gates"] == "passed"
            report = read_report(store, model_partition_uri(model, ds))
            assert runs[ds].data.metrics == {
                k: v for k, v in report_metrics(report).items() if v is not None
            }
        info = [e.user_message for e in instance.all_logs(again.run_id)]
        assert any(
            f"MLflow: logged {DS1}, {DS2} from storage, with their gates" in m for m in info
        ), [m for m in info if "MLflow" in m]
        on = client.get_model_version_by_alias(model.name, "champion")
        assert on.tags["zipline.partition"] == DS2
        # DS1, the champion the outage moved past, has its model version too
        versions = client.search_model_versions(f"name = '{model.name}'")
        assert sorted(v.tags["zipline.partition"] for v in versions) == [DS1, DS2]
        assert any(
            f"MLflow: registered earlier champions {model.version}/{DS1} " in m for m in info
        ), [m for m in info if "MLflow" in m]

        # copied: models:/NAME@champion downloads the model's own files, as a deployment
        # pointed at the server would
        import mlflow.artifacts

        monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
        got = Path(mlflow.artifacts.download_artifacts(f"models:/{model.name}@champion"))
        manifest = json.loads(store.read_bytes(model_partition_uri(model, DS2) + "/_MANIFEST.json"))
        for entry in manifest["files"]:
            assert (got / entry["path"]).exists(), entry["path"]
    finally:
        proxy.close()


def test_credentials_in_a_tracking_uri_never_show(file_base: str) -> None:
    """A tracking URI holding a user and password (MLflow's own variables are the place
    for them): unreachable, the step's warning names the server without them."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warned: list[str] = []
    uri = f"http://alice:s3cret-pw@127.0.0.1:{port}"
    tracker = MlflowResource(tracking_uri=uri, timeout_s=2).tracker(warned.append)
    assert tracker is not None
    logged = tracker.log(
        Partition("m", "models/m", DS1, "v", "a1", f"{file_base}/models/m/v/{DS1}", {})
    )
    assert logged is None and len(warned) == 1
    assert f"MLflow at http://127.0.0.1:{port} skipped" in warned[0]
    assert "s3cret-pw" not in warned[0] and "alice" not in warned[0]


def test_a_slow_tracking_server_costs_a_step_at_most_its_budget(
    mlflow_server: Any, file_base: str
) -> None:
    """Every MLflow call answers, slowly (each request held 0.4 s by the proxy): the step
    stops waiting once MLflow has taken its budget, says so once, and skips MLflow for the
    rest of the step (the champion's next evaluation logs what it missed)."""
    proxy = TcpProxy("127.0.0.1", mlflow_server.port, latency=0.4)
    warned: list[str] = []
    try:
        conf = MlflowResource(tracking_uri=proxy.url, timeout_s=5, step_budget_s=1)
        tracker = conf.tracker(warned.append)
        assert tracker is not None
        days = (DS1, DS2)
        for ds in days:
            p = Partition("slow_model", "models/slow_model", ds, "v", "a1", f"{file_base}/{ds}", {})
            assert tracker.log(p) is None
        assert warned == [
            f"MLflow at {proxy.url} skipped (log slow_model {DS1}): it has taken 1s of this "
            "step. Nothing else waits on it in this step; the champion's next evaluation logs "
            "what it missed"
        ]
        assert tracker.spent < 1 + 0.5  # the budget, and one watch interval's slack
    finally:
        proxy.close()


def test_the_tracking_server_runs_without_a_job_runner(mlflow_server: Any) -> None:
    """The server `make demo-mlflow` and the tests start runs no job runner (MLflow's
    GenAI evaluation jobs, unused here): with it, `mlflow server` starts seven huey
    consumer processes and a /dev/shm folder per start that nothing removes."""
    from zipline_dagster.processes import descendants

    server = mlflow_server.identity.pid
    # a job runner starts its consumers within seconds of the server: look once the
    # server has run for 10 s (at once in the suite, where it has run for minutes); its
    # identity's start is "{boot id}:{start time in clock ticks}"
    ticks = int(str(mlflow_server.identity.start).rsplit(":", 1)[1])
    up = float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    time.sleep(max(0.0, 10.0 - up))
    members = [
        Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        for p in descendants(server)
    ]
    assert any("uvicorn" in cmd for cmd in members), members  # the server itself
    assert not [cmd for cmd in members if "huey" in cmd]
