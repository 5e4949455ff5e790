"""Trust under faults, on the real components: a retrain that fails, a step killed with
-9 while its Ray job goes on, two runs of one partition at once, and a network fault
between the platform and the Ray dashboard (a loopback proxy cut mid-job).

What Dagster records and what storage holds must agree after each of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import BIN, FIXTURE_TRAINERS, ROOT
from tests.helpers import days_ending, local, write_table
from tests.support.training import TABLE, make_model, ray_client, resources
from tests.tcp_proxy import TcpProxy
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.resources import RayJobsResource
from zipline_dagster.lineage.backfill import plan_backfill
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.manifests import model_partition
from zipline_dagster.storage.paths import MANIFEST_NAME
from zipline_dagster.training.assets import build_model_asset


def partition_files(model_dir: str) -> dict[str, bytes]:
    """The finished partition's own files (not attempts, superseded or locks)."""
    root = local(model_dir)
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


#: its own day: Ray job ids are per cluster, and other tests train DS on the same head
RETRAIN_DS = "2026-07-26"


def materialize_on(
    instance: dg.DagsterInstance, model: Any, res: dict[str, Any], ds: str = RETRAIN_DS
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [build_model_asset(model=model)],
        partition_key=ds,
        resources=res,
        instance=instance,
        raise_on_error=False,
    )


def log_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.user_message]


def test_failed_retrain_leaves_the_finished_model_in_place(
    launcher: str | None, file_base: str, trainer_copy: Path
) -> None:
    write_table(file_base, TABLE, days_ending(RETRAIN_DS, 4), rows=300)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    res = resources(launcher, file_base)
    instance = dg.DagsterInstance.ephemeral()
    first = materialize_on(instance, model, res)
    assert first.success
    model_dir = f"{file_base}/models/listing_ctr_model/{version}/{RETRAIN_DS}"
    before = partition_files(model_dir)
    assert MANIFEST_NAME in before and "model.json" in before

    # The same version and day retrained with a config the trainer rejects.
    broken = make_model(version, file_base, job_configs={"label-column": "no_such_column"})
    second = materialize_on(instance, broken, res)
    assert not second.success
    # The finished model is exactly where it was, and still verifies.
    assert partition_files(model_dir) == before
    assert model_partition(blob_store(model_dir), model_dir, checksums=True).committed
    assert not (local(model_dir) / "_superseded").exists()
    # Dagster's latest materialization (the first run) and storage agree: fresh.
    defs = dg.Definitions(assets=[build_model_asset(model=model)], resources=res)
    key = dg.AssetKey(["models", "listing_ctr_model"])
    assert plan_backfill(defs, instance, key, [RETRAIN_DS]).empty

    # A successful retrain then supersedes it, manifest last.
    third = materialize_on(instance, model, res)
    assert third.success
    superseded = list((local(model_dir) / "_superseded").iterdir())
    assert len(superseded) == 1
    assert (superseded[0] / "model.json").read_bytes() == before["model.json"]
    assert model_partition(blob_store(model_dir), model_dir, checksums=True).committed


KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    import dagster as dg
    from tests.support.training import make_model, resources
    from zipline_dagster.training.assets import build_model_asset

    version, base, address, ds, steps = sys.argv[1:6]
    model = make_model(version, base, name="slow_model", job_configs={"steps": steps})
    dg.materialize([build_model_asset(model=model)], partition_key=ds,
                   resources=resources(address, base), instance=dg.DagsterInstance.ephemeral())
    """
)


def wait_job(client: Any, sid: str, *, want: set[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    status = "NONE"
    while time.monotonic() < deadline:
        try:
            status = str(client.get_job_status(sid))
        except Exception:
            status = "NONE"
        if status in want:
            return status
        time.sleep(0.3)
    raise AssertionError(f"job {sid} still {status} after {timeout}s; wanted {want}")


@pytest.mark.ray
def test_step_killed_while_its_job_goes_on_leaves_the_finished_model(
    ray_head: Any, file_base: str
) -> None:
    ds = "2026-07-21"
    write_table(file_base, TABLE, days_ending(ds, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    model = make_model(version, file_base, name="slow_model", job_configs={"steps": "1"})
    instance = dg.DagsterInstance.ephemeral()
    first = dg.materialize(
        [build_model_asset(model=model)],
        partition_key=ds,
        resources=resources(ray_head.dashboard_url, file_base),
        instance=instance,
    )
    assert first.success
    model_dir = f"{file_base}/models/slow_model/{version}/{ds}"
    before = partition_files(model_dir)

    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, version, file_base, ray_head.dashboard_url, ds, "8"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = ray_client(ray_head.dashboard_url)
    sid = f"zd-slow_model-{version}-{ds}-2"
    wait_job(client, sid, want={"RUNNING"})
    proc.send_signal(signal.SIGKILL)  # the step dies; nothing stops the job
    proc.wait(30)
    assert wait_job(client, sid, want={"SUCCEEDED", "FAILED", "STOPPED"}) == "SUCCEEDED"
    # The job wrote its attempt, but nobody promoted it: the finished model is untouched.
    assert (local(model_dir) / "_attempts" / sid / "metrics.json").exists()
    assert partition_files(model_dir) == before
    assert model_partition(blob_store(model_dir), model_dir, checksums=True).committed


CONCURRENT_DEFS = textwrap.dedent(
    """
    import os
    import dagster as dg
    from tests.support.training import make_model, resources
    from zipline_dagster.training.assets import build_model_asset

    model = make_model(os.environ["ZDT_VERSION"], os.environ["ZDT_BASE"], name="slow_model",
                       job_configs={"steps": os.environ["ZDT_STEPS"]})
    defs = dg.Definitions(assets=[build_model_asset(model=model)],
                          resources=resources(os.environ["ZDT_RAY"], os.environ["ZDT_BASE"]))
    """
)


@pytest.mark.ray
@pytest.mark.slow
def test_two_concurrent_runs_of_one_partition_share_one_job_and_one_promotion(
    ray_head: Any, file_base: str, tmp_path: Path
) -> None:
    """Two `dagster asset materialize` of one partition started together: one Ray job,
    one promotion (the earlier model superseded once), a manifest that verifies, both
    runs clean."""
    ds = "2026-07-22"
    write_table(file_base, TABLE, days_ending(ds, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs_file = tmp_path / "concurrent_defs.py"
    defs_file.write_text(CONCURRENT_DEFS)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "ZDT_VERSION": version,
        "ZDT_BASE": file_base,
        "ZDT_RAY": ray_head.dashboard_url,
    }
    cmd = [
        str(BIN / "dagster"),
        "asset",
        "materialize",
        "-f",
        str(defs_file),
        "--select",
        "models/slow_model",
        "--partition",
        ds,
    ]
    # a finished model to be superseded
    first = subprocess.run(
        cmd, env={**env, "ZDT_STEPS": "1"}, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr[-3000:]
    model_dir = f"{file_base}/models/slow_model/{version}/{ds}"
    old_manifest = json.loads((local(model_dir) / MANIFEST_NAME).read_text())

    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "ZDT_STEPS": "10"},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
        assert "RUN_SUCCESS" in out, out[-4000:]

    client = ray_client(ray_head.dashboard_url)
    jobs = [
        j.submission_id
        for j in client.list_jobs()
        if (j.submission_id or "").startswith(f"zd-slow_model-{version}-{ds}-")
    ]
    assert sorted(jobs) == [f"zd-slow_model-{version}-{ds}-1", f"zd-slow_model-{version}-{ds}-2"]
    manifest = json.loads((local(model_dir) / MANIFEST_NAME).read_text())
    assert manifest["attempt"] == f"zd-slow_model-{version}-{ds}-2"
    assert model_partition(blob_store(model_dir), model_dir, checksums=True).committed
    superseded = list((local(model_dir) / "_superseded").iterdir())
    assert len(superseded) == 1  # promoted once, not twice
    assert json.loads((superseded[0] / MANIFEST_NAME).read_text()) == old_manifest
    assert not (local(model_dir) / "_PROMOTING.lock").exists()
    assert sum("re-attach" in out for out in outs) == 1  # the second run followed the first's job


def slow_setup(file_base: str, ds: str, steps: str) -> tuple[str, Any]:
    write_table(file_base, TABLE, days_ending(ds, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    return version, make_model(version, file_base, name="slow_model", job_configs={"steps": steps})


def dashboard_proxy(ray_head: Any) -> TcpProxy:
    host, port = ray_head.dashboard_url.rsplit("//", 1)[1].split(":")
    return TcpProxy(host, int(port))


def cut_for(proxy: TcpProxy, client: Any, sid: str, seconds: float) -> threading.Thread:
    """Once the job runs, cut the proxy for ``seconds`` (forever when negative)."""

    def run() -> None:
        wait_job(client, sid, want={"RUNNING"})
        time.sleep(1.0)
        proxy.cut()
        if seconds >= 0:
            time.sleep(seconds)
            proxy.restore()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.ray
def test_dashboard_blip_mid_job_is_ridden_out(ray_head: Any, file_base: str) -> None:
    ds = "2026-07-23"
    version, model = slow_setup(file_base, ds, "16")
    proxy = dashboard_proxy(ray_head)
    try:
        res = resources(None, file_base)
        res["launcher"] = RayJobsResource(address=proxy.url, poll_max_s=0.5, timeout_s=300)
        client = ray_client(ray_head.dashboard_url)  # the test's own view, not through the proxy
        sid = f"zd-slow_model-{version}-{ds}-1"
        cutter = cut_for(proxy, client, sid, 6.0)
        instance = dg.DagsterInstance.ephemeral()
        result = materialize_on(instance, model, res, ds)
        cutter.join(30)
    finally:
        proxy.close()
    assert proxy.refused > 0, "the fault never hit the platform"
    assert result.success
    logs = log_messages(instance, result.run_id)
    assert any("unreachable" in m and "keeps running" in m for m in logs), logs
    assert any("reachable again" in m for m in logs)
    # one job, never stopped or resubmitted, and every log line forwarded exactly once
    assert str(client.get_job_status(sid)) == "SUCCEEDED"
    prefix = f"zd-slow_model-{version}-{ds}-"
    assert [
        j.submission_id for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)
    ] == [sid]
    for n in (0, 7, 15):
        assert sum(m.endswith(f"] step {n}") for m in logs) == 1, n
    assert any(m.endswith("] slow trainer done") for m in logs)


@pytest.mark.ray
def test_dashboard_lost_past_tolerance_fails_the_step_and_leaves_the_job(
    ray_head: Any, file_base: str
) -> None:
    ds = "2026-07-24"
    version, model = slow_setup(file_base, ds, "24")
    proxy = dashboard_proxy(ray_head)
    client = ray_client(ray_head.dashboard_url)
    sid = f"zd-slow_model-{version}-{ds}-1"
    instance = dg.DagsterInstance.ephemeral()
    try:
        res = resources(None, file_base)
        res["launcher"] = RayJobsResource(
            address=proxy.url, poll_max_s=0.5, timeout_s=300, unreachable_tolerance_s=3
        )
        cutter = cut_for(proxy, client, sid, -1)
        result = materialize_on(instance, model, res, ds)
        cutter.join(30)
        assert not result.success
        err = result.get_step_failure_events()[0].step_failure_data.error
        assert err is not None
        text = err.to_string()
        assert "lost contact with the Ray dashboard" in text
        assert f"Ray job {sid} was not stopped and may still be running" in text
        assert "a retry of this step re-attaches to it" in text
        # The job was left alone.
        assert str(client.get_job_status(sid)) == "RUNNING"

        # The network comes back; a retry re-attaches to the same job and finishes it.
        proxy.restore()
        retry = materialize_on(instance, model, res, ds)
    finally:
        proxy.close()
    assert retry.success
    mat = retry.get_asset_materialization_events()[0].event_specific_data.materialization  # type: ignore[union-attr]
    assert mat.metadata["ray_job_id"].value == sid
    assert mat.metadata["reattached"].value is True


@pytest.mark.ray
def test_dashboard_that_never_answers_fails_the_step_and_leaves_the_job(
    ray_head: Any, file_base: str
) -> None:
    """The dashboard accepts connections and answers nothing (a hung process): each
    request gives up after request_timeout_s, so the step ends past the tolerance as for a
    lost dashboard, instead of waiting on one request until the run is cancelled."""
    ds = "2026-07-26"
    version, model = slow_setup(file_base, ds, "40")
    proxy = dashboard_proxy(ray_head)
    client = ray_client(ray_head.dashboard_url)
    sid = f"zd-slow_model-{version}-{ds}-1"
    res = resources(None, file_base)
    res["launcher"] = RayJobsResource(
        address=proxy.url,
        poll_max_s=0.5,
        timeout_s=300,
        unreachable_tolerance_s=3,
        request_timeout_s=2,
    )
    outcome: list[Any] = []

    def stall_once_running() -> None:
        wait_job(client, sid, want={"RUNNING"})
        time.sleep(1.0)
        proxy.stall()

    def run_step() -> None:
        # the instance lives and is disposed in this thread (its SQLite connections
        # belong to the thread that made them)
        with dg.DagsterInstance.ephemeral() as instance:
            outcome.append(materialize_on(instance, model, res, ds))

    staller = threading.Thread(target=stall_once_running, daemon=True)
    step = threading.Thread(target=run_step, daemon=True)
    try:
        staller.start()
        step.start()
        step.join(120)  # without a request timeout the step waits here until cancelled
        assert outcome, "the step still waits on a dashboard that never answers"
        assert str(client.get_job_status(sid)) == "RUNNING"  # the job was left alone
    finally:
        proxy.close()
        with contextlib.suppress(Exception):
            client.stop_job(sid)
    result = outcome[0]
    assert not result.success
    err = result.get_step_failure_events()[0].step_failure_data.error
    assert err is not None
    text = err.to_string()
    assert "lost contact with the Ray dashboard" in text and "ReadTimeout" in text, text
    assert f"Ray job {sid} was not stopped and may still be running" in text


@pytest.mark.ray
def test_a_job_failing_after_its_trainer_finished_is_finished_from_storage(
    ray_head: Any, file_base: str
) -> None:
    """The job's process exits 3 on its way out, after the trainer finished and the
    driver wrote its end marker: Ray says FAILED, storage says the day trained. The step
    promotes what the trainer wrote (no second job), and says why."""
    ds = "2026-07-19"
    write_table(file_base, TABLE, days_ending(ds, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    model = make_model(
        version,
        file_base,
        name="slow_model",
        job_configs={"steps": "1", "exit-code-at-exit": "3"},
    )
    instance = dg.DagsterInstance.ephemeral()
    result = materialize_on(instance, model, resources(ray_head.dashboard_url, file_base), ds)
    assert result.success
    client = ray_client(ray_head.dashboard_url)
    sid = f"zd-slow_model-{version}-{ds}-1"
    info = client.get_job_info(sid)
    assert (str(info.status), info.driver_exit_code) == ("FAILED", 3)
    prefix = f"zd-slow_model-{version}-{ds}-"
    assert [
        j.submission_id for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)
    ] == [sid]
    mat = result.get_asset_materialization_events()[0].event_specific_data.materialization  # type: ignore[union-attr]
    assert mat.metadata["ray_job_id"].value == sid
    model_dir = f"{file_base}/models/slow_model/{version}/{ds}"
    assert model_partition(blob_store(model_dir), model_dir, checksums=True).committed
    assert json.loads((local(model_dir) / MANIFEST_NAME).read_text())["attempt"] == sid
    said = [m for m in log_messages(instance, result.run_id) if "end marker on storage" in m]
    assert len(said) == 1 and f"Ray job {sid} FAILED" in said[0], said


def test_request_timeout_must_be_positive() -> None:
    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner

    for bad in (0, -1.0, float("nan"), float("inf"), True, "30"):
        with pytest.raises(
            ValueError, match=r"request_timeout_s=.* is invalid; expected seconds > 0"
        ):
            RayJobRunner(address="http://127.0.0.1:8265", request_timeout_s=bad)  # type: ignore[arg-type]


@pytest.mark.ray
def test_timeout_counts_from_the_jobs_own_start(ray_head: Any, file_base: str) -> None:
    """A step that re-attaches to a job started 9 s earlier, with an 8 s timeout, stops it
    at once, not 8 s after attaching."""
    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
    from zipline_dagster.jobs.request import (
        build_training_request,
    )

    ds = "2026-07-25"
    _, model = slow_setup(file_base, ds, "60")
    early = RayJobRunner(address=ray_head.dashboard_url, auth_mode="disabled")
    job, _ = early.submit_or_attach(
        build_training_request(model, ds, warehouse=file_base), requirements=[], metadata={}
    )
    client = ray_client(ray_head.dashboard_url)
    wait_job(client, job.attempt_id or "", want={"RUNNING"})
    time.sleep(9)
    res = resources(None, file_base)
    res["launcher"] = RayJobsResource(address=ray_head.dashboard_url, poll_max_s=0.5, timeout_s=8)
    attached_at = time.time()
    result = dg.materialize(
        [build_model_asset(model=model)],
        partition_key=ds,
        resources=res,
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    err = result.get_step_failure_events()[0].step_failure_data.error
    assert err is not None and "counted from the job's start" in err.to_string()
    info = client.get_job_info(job.attempt_id)
    assert str(info.status) == "STOPPED"
    # counted from the re-attach it would have been stopped >= 8 s after it
    assert info.end_time / 1000 - attached_at < 7
