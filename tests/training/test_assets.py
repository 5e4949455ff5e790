"""Model assets materialized through Dagster against a real local Ray cluster."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from zipline_runtime.driver import attempt_flags, partition_results

from tests.conftest import FIXTURE_TRAINERS, TRAINERS, free_port
from tests.helpers import ctr_rows, days_ending, write_partition, write_table
from tests.support.training import (
    BUCKETS,
    DS,
    TABLE,
    make_model,
    materialize,
    only_materialization,
    ray_client,
    resources,
)
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.resources import RayJobsResource
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.paths import MANIFEST_NAME


def job_prefix(launcher: str | None, name: str, version: str, ds: str = DS) -> str:
    return f"zd-{name}-{version}-{ds}-1" if launcher else f"local-{name}-{version}-{ds}-"


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    events = result.get_step_failure_events()
    assert events, "expected the step to fail"
    err = events[0].step_failure_data.error
    assert err is not None
    # A clear Failure, not some other exception that happened to carry the text.
    assert err.cls_name == "Failure", err.to_string()
    assert err.cause is None, err.to_string()
    return err.to_string()


def test_materialize_partition_file_warehouse(
    launcher: str | None, file_base: str, trainer_copy: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=400)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = make_model(version, file_base)
    res = resources(launcher, file_base)
    # the worker's shared head may hold earlier attempts of this partition (another
    # module trained the reference trainer's day): a new attempt numbers after them
    key = f"zd-listing_ctr_model-{version}-{DS}-"
    earlier = launcher and sum(
        1 for j in ray_client(launcher).list_jobs() if (j.submission_id or "").startswith(key)
    )

    result = materialize(model, res)
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    model_dir = f"{file_base}/models/listing_ctr_model/{version}/{DS}"
    assert md["version"] == version
    assert md["archive_uri"] == f"{file_base}/builds/listing_ctr_model-{version}.zip"
    assert md["artifact_uri"] == model_dir
    assert md["window"] == "2026-07-07..2026-07-10"
    assert md["train/rows"] == 1200 and md["holdout/rows"] == 400
    assert md["train/date_range"] == "2026-07-07..2026-07-09"
    assert md["holdout/date_range"] == "2026-07-10..2026-07-10"
    assert 0.6 < md["holdout/auc"] < 1.0  # the synthetic table has a real signal
    assert md["train/auc"] >= md["holdout/auc"]  # both present, so the gap shows
    for split in ("train", "holdout"):
        assert isinstance(md[f"{split}/logloss"], float)
    assert {r.data["feature"] for r in md["feature_importance"].records} == {
        "price_log",
        "inventory_count",
    }
    assert md["pr_curve"].startswith("![precision-recall curve](data:image/png;base64,iVBOR")
    assert md["report"]["split"]["method"] == "date"
    assert md["launcher"] == ("ray" if launcher else "local")
    if launcher:
        job_id = md["ray_job_id"]
        assert job_id == f"{key}{earlier + 1}"
        assert md["ray_dashboard"] == f"{launcher}/#/jobs/{job_id}"
        info = ray_client(launcher).get_job_info(job_id)
        assert str(info.status) == "SUCCEEDED"
        # The archive's platform driver runs `python -m trainer.train` in the job's own
        # process with exactly the contract's flags, each attempt in its own folder.
        argv = shlex.split(info.entrypoint)
        assert argv[:6] == [
            "python",
            "-m",
            "zipline_runtime.driver",
            f"--attempt-id={job_id}",
            "--module=trainer.train",
            "--in-process",
        ]
        flags = json.loads(argv[6].removeprefix("--partitions="))[DS]
        assert flags[:4] == [
            "--input-table=ctr.training_v1",
            "--start-ds=2026-07-07",
            "--end-ds=2026-07-10",
            f"--model-dir={model_dir}",
        ]
        assert attempt_flags(flags, job_id)[3] == f"--model-dir={model_dir}/_attempts/{job_id}"
        assert f"--warehouse={file_base}" in flags
        # The driver's end marker (the step watched storage for it), beside the attempt:
        # the partition's result line, then the driver's last line.
        marker = f"{model_dir}/_attempts/{job_id}.done"
        assert argv[7:] == [f"--done-uri={marker}"]
        result_line, last = blob_store(marker).read_bytes(marker).decode().splitlines()
        assert partition_results(result_line)[DS]["exit_code"] == 0
        assert last.startswith("zipline-partitions-done 1 of 1")
        logs = ray_client(launcher).get_job_logs(job_id)
        assert f"attempts/{job_id}" in logs  # the trainer's own log line, streamed live
    else:
        job_id = md["job_id"]
        assert job_id.startswith(job_prefix(launcher, "listing_ctr_model", version))
        assert "ray_job_id" not in md

    files = sorted(p.name for p in Path(model_dir[len("file://") :]).iterdir() if p.is_file())
    assert files == [MANIFEST_NAME, "card.md", "metrics.json", "model.json", "pr_curve.png"]
    # its card, on the materialization (Markdown the UI renders) and beside the artifacts
    card = md["card"]
    assert Path(model_dir[len("file://") :], "card.md").read_text() == card
    assert f"| trainer version | `{version}` |" in card
    assert "| window | 2026-07-07..2026-07-10 (4 days) |" in card
    assert f"`ctr.training_v1` snapshot `{md['input_snapshot_id']}`" in card
    assert f"| holdout_auc | {md['holdout/auc']:.4f} | - | - |" in card  # no gate declared
    assert "`--input-table=ctr.training_v1`" in card
    assert re.search(r"\| cost \| [\d.]+s wall, [\d.]+ CPU-s, peak \d+ MB \|", card), card
    assert "**Champion**: none when this partition trained" in card
    # the promoted attempt keeps only a note of what it became
    attempt = Path(model_dir[len("file://") :], "_attempts", job_id)
    assert sorted(p.name for p in attempt.iterdir()) == ["_PROMOTED.json"]
    manifest = json.loads(Path(model_dir[len("file://") :], MANIFEST_NAME).read_text())
    for entry in manifest["files"]:
        data = Path(model_dir[len("file://") :], entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert manifest["job_id"] == job_id

    # Retraining the same (version, ds) keeps the earlier artifacts recoverable.
    first_model = Path(model_dir[len("file://") :], "model.json").read_bytes()
    again = materialize(model, res)
    assert again.success
    md2 = {k: v.value for k, v in only_materialization(again).metadata.items()}
    if launcher:
        assert md2["ray_job_id"] == f"{key}{earlier + 2}"
    superseded = Path(md2["superseded_artifacts"][len("file://") :])
    assert superseded.parent.name == "_superseded" and superseded.is_relative_to(
        Path(model_dir[len("file://") :])
    )
    assert (superseded / "model.json").read_bytes() == first_model
    assert (superseded / MANIFEST_NAME).exists()


#: (launcher, where the archive and artifacts live, where the tables live). Ray fetches
#: the archive itself: from s3:// and gs:// here; from Azurite it cannot (see
#: test_ray_refuses_an_archive_it_cannot_fetch_at_load), so that case keeps its archive
#: on file:// while the trainer reads its tables from abfss://.
STORE_CASES = [
    ("ray", "s3", "s3"),
    ("ray", "gs", "gs"),
    ("ray", "file", "abfss"),
    ("local", "s3", "file"),
    ("local", "gs", "gs"),
    ("local", "abfss", "abfss"),
]
SECRETS = {"s3": "AWS_SECRET_ACCESS_KEY", "abfss": "AZURE_STORAGE_CONNECTION_STRING"}


@pytest.mark.parametrize(("launcher_kind", "base_scheme", "warehouse_scheme"), STORE_CASES)
def test_materialize_on_object_stores(
    launcher_kind: str,
    base_scheme: str,
    warehouse_scheme: str,
    request: pytest.FixtureRequest,
    trainer_copy: Path,
) -> None:
    """A model partition end to end with its archive, artifacts and tables on real storage
    servers on loopback: the platform and the trainer use the same storage layer."""
    launcher = (
        str(request.getfixturevalue("ray_head").dashboard_url) if launcher_kind == "ray" else None
    )
    base = str(request.getfixturevalue(BUCKETS[base_scheme])) + "/ml"
    warehouse = str(request.getfixturevalue(BUCKETS[warehouse_scheme])) + "/wh"
    env: dict[str, str] = {}
    for fixture in ("s3_env", "gcs_env", "azure_env"):
        env.update(request.getfixturevalue(fixture))
    write_table(warehouse, TABLE, days_ending(DS, 4), rows=300)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=base
    ).version
    model = make_model(version, base)
    result = materialize(model, resources(launcher, warehouse, env))
    assert result.success, failure_text(result)
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    model_dir = f"{base}/models/listing_ctr_model/{version}/{DS}"
    assert md["archive_uri"] == f"{base}/builds/listing_ctr_model-{version}.zip"
    assert md["artifact_uri"] == model_dir
    store = blob_store(model_dir)
    assert [u.rsplit("/", 1)[1] for u in store.list(model_dir) if "/_attempts/" not in u] == [
        MANIFEST_NAME,
        "card.md",
        "metrics.json",
        "model.json",
        "pr_curve.png",
    ]
    report = json.loads(store.read_bytes(f"{model_dir}/metrics.json"))
    assert report["holdout"]["rows"] == 300 and report["train"]["rows"] == 900
    assert report["input_table"] == TABLE
    secrets = [env[name] for s, name in SECRETS.items() if s in (base_scheme, warehouse_scheme)]
    public = json.dumps({k: str(v.value) for k, v in only_materialization(result).metadata.items()})
    if launcher:
        # Secrets reach the job through the head's environment, never its public job info.
        info = ray_client(launcher).get_job_info(md["ray_job_id"])
        public += json.dumps(
            {"runtime_env": info.runtime_env, "metadata": info.metadata, "entry": info.entrypoint}
        )
    for secret in secrets:
        assert secret not in public


def test_one_class_holdout_reports_why_auc_is_missing(
    launcher: str | None, file_base: str, trainer_copy: Path
) -> None:
    days = days_ending(DS, 4)
    write_table(file_base, TABLE, days[:-1], rows=300)
    write_partition(file_base, TABLE, days[-1], ctr_rows(days[-1], 200, label=0))
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    result = materialize(make_model(version, file_base), resources(launcher, file_base))
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert "holdout/auc" not in md
    assert "holdout has one class" in md["status/holdout.auc"]
    assert "holdout has one class" in md["status/pr_curve"]
    assert isinstance(md["holdout/logloss"], float) and isinstance(md["train/auc"], float)
    assert md["pr_curve"].startswith("_no precision-recall curve")


def test_failing_trainer_fails_step_with_its_traceback(
    launcher: str | None, file_base: str
) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=50)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "failing_trainer", model_name="failing_model", base=file_base
    ).version
    model = make_model(version, file_base, name="failing_model", job_configs={})
    result = materialize(model, resources(launcher, file_base), raise_on_error=False)
    assert not result.success
    text = failure_text(result)
    assert job_prefix(launcher, "failing_model", version) in text and " FAILED" in text
    assert "Traceback (most recent call last)" in text
    assert "in load_matrix" in text
    assert "ValueError: feature matrix has NaN in column price_log" in text
    # nothing committed for a failed run
    assert not blob_store(file_base).exists(
        f"{file_base}/models/failing_model/{version}/{DS}/{MANIFEST_NAME}"
    )


@pytest.mark.ray
def test_second_submission_reattaches_to_live_job(ray_head: Any, file_base: str) -> None:
    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
    from zipline_dagster.jobs.request import (
        build_training_request,
    )

    write_table(file_base, TABLE, days_ending(DS, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    model = make_model(version, file_base, name="slow_model", job_configs={"steps": "12"})
    # A step that submitted and then died: its job is still running on the cluster.
    first = RayJobRunner(address=ray_head.dashboard_url, auth_mode="disabled")
    request = build_training_request(model, DS, warehouse=file_base)
    job, attached = first.submit_or_attach(request, requirements=[], metadata={})
    sid = job.attempt_id
    assert (sid, attached) == (f"zd-slow_model-{version}-{DS}-1", False)

    result = materialize(model, resources(ray_head.dashboard_url, file_base))
    assert result.success, failure_text(result)
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["ray_job_id"] == sid and md["reattached"] is True
    assert first.find_attempt(request.job_key)[0] == 1  # no second job was started


CANCEL_SCRIPT = textwrap.dedent(
    """
    import sys
    import dagster as dg
    from tests.training.test_assets import make_model, resources
    from zipline_dagster.training.assets import build_model_asset

    version, base, address, ds = sys.argv[1:5]
    model = make_model(version, base, name="slow_model", job_configs={"steps": "600"})
    dg.materialize([build_model_asset(model=model)], partition_key=ds,
                   resources=resources(address, base), instance=dg.DagsterInstance.ephemeral())
    """
)


@pytest.mark.ray
def test_cancelled_run_stops_the_ray_job_even_when_interrupted_twice(
    ray_head: Any, file_base: str
) -> None:
    ds = "2026-07-20"  # its own (model, version, ds): job ids are per cluster
    write_table(file_base, TABLE, days_ending(ds, 4), rows=20)
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="slow_model", base=file_base
    ).version
    proc = subprocess.Popen(
        [sys.executable, "-c", CANCEL_SCRIPT, version, file_base, ray_head.dashboard_url, ds],
        cwd=str(TRAINERS.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = ray_client(ray_head.dashboard_url)
    sid = f"zd-slow_model-{version}-{ds}-1"
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        try:
            status = str(client.get_job_status(sid))
        except Exception:
            status = None
        if status == "RUNNING" and "step 1" in client.get_job_logs(sid):
            break
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.3)
    assert status == "RUNNING"
    proc.send_signal(signal.SIGINT)  # what Dagster's run termination delivers
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # an impatient second interrupt
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 30
    while str(client.get_job_status(sid)) != "STOPPED" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert str(client.get_job_status(sid)) == "STOPPED", out[-3000:]


def test_missing_window_partitions_fail_before_submitting(
    file_base: str, trainer_copy: Path
) -> None:
    days = days_ending(DS, 4)
    write_table(file_base, TABLE, [days[0], days[2]], rows=10)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    # No Ray is needed: the check runs before any cluster is contacted.
    res = resources(f"http://127.0.0.1:{free_port()}", file_base)
    result = materialize(make_model(version, file_base), res, raise_on_error=False)
    text = failure_text(result)
    assert (
        "is missing partitions 2026-07-08, 2026-07-10 of the window 2026-07-07..2026-07-10" in text
    )
    assert "the table has 2026-07-07, 2026-07-09" in text


def test_empty_training_table_names_what_exists(file_base: str, trainer_copy: Path) -> None:
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    res = resources(f"http://127.0.0.1:{free_port()}", file_base)
    text = failure_text(materialize(make_model(version, file_base), res, raise_on_error=False))
    assert "is missing partitions 2026-07-07..2026-07-10" in text and "the table has none" in text


def test_missing_archive_fails_naming_path(file_base: str) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=10)
    res = resources(f"http://127.0.0.1:{free_port()}", file_base)
    text = failure_text(
        materialize(make_model("0123456789ab", file_base), res, raise_on_error=False)
    )
    assert f"{file_base}/builds/listing_ctr_model-0123456789ab.zip" in text and "missing" in text


def test_tampered_archive_fails_naming_path(file_base: str, trainer_copy: Path) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=10)
    published = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    )
    store = blob_store(published.uri)
    store.write_bytes(published.uri, store.read_bytes(published.uri)[:-10] + b"0123456789")
    res = resources(f"http://127.0.0.1:{free_port()}", file_base)
    text = failure_text(
        materialize(make_model(published.version, file_base), res, raise_on_error=False)
    )
    assert published.uri in text and "does not match its version" in text


def test_unreachable_ray_fails_clearly(file_base: str, trainer_copy: Path) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=10)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    address = f"http://127.0.0.1:{free_port()}"
    text = failure_text(
        materialize(
            make_model(version, file_base), resources(address, file_base), raise_on_error=False
        )
    )
    assert f"no Ray cluster answers at {address}" in text and "zipline-dagster ray up" in text


def test_local_launcher_refuses_unmet_requirements(file_base: str, tmp_path: Path) -> None:
    import shutil

    trainer = tmp_path / "needs_more"
    shutil.copytree(FIXTURE_TRAINERS / "failing_trainer", trainer)
    (trainer / "setup.py").write_text(
        'from setuptools import setup\nsetup(name="needs_more", install_requires=["zd-not-installed==1.0", "pandas>=99"])\n'
    )
    write_table(file_base, TABLE, days_ending(DS, 4), rows=10)
    version = publish_trainer_archive(trainer, model_name="needs_more", base=file_base).version
    model = make_model(version, file_base, name="needs_more", job_configs={})
    text = failure_text(materialize(model, resources(None, file_base), raise_on_error=False))
    assert "zd-not-installed==1.0 (not installed)" in text
    assert "pandas>=99 (installed 2." in text


def test_unusable_embedded_head_fails_the_step_clearly(
    file_base: str, trainer_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    write_table(file_base, TABLE, days_ending(DS, 4), rows=10)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    (tmp_path / "not_a_folder").write_text("")
    res = resources(None, file_base)
    res["launcher"] = RayJobsResource(embedded_state_dir=str(tmp_path / "not_a_folder" / "ray"))
    text = failure_text(materialize(make_model(version, file_base), res, raise_on_error=False))
    assert "cannot use" in text and "embedded Ray head's state folder" in text
    assert "NotADirectoryError" in text
