"""Training requests, flags, windows and the artifact commit protocol (no Ray needed)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from zipline_runtime.driver import RESULT_PREFIX, TAIL_LINES

from tests.helpers import s3_requests
from tests.support.jobs import _attempt
from tests.support.training import BUCKETS, make_model
from zipline_dagster.jobs.request import (
    build_training_request,
    window_days,
)
from zipline_dagster.storage.artifacts import (
    ArtifactError,
    attempt_dir,
    promote_attempt,
    promotion_lock,
    supersede_previous,
)
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.manifests import (
    PROMOTE_LOCK_NAME,
    PROMOTED_NAME,
    ManifestFile,
    model_partition,
)
from zipline_dagster.storage.paths import MANIFEST_NAME


def test_window_is_exactly_n_days_ending_at_ds() -> None:
    assert window_days("2026-07-10", 4) == ["2026-07-07", "2026-07-08", "2026-07-09", "2026-07-10"]
    assert window_days("2026-03-01", 2) == ["2026-02-28", "2026-03-01"]
    assert window_days("2026-07-10", 1) == ["2026-07-10"]


def test_flags_platform_first_then_job_configs() -> None:
    model = make_model(
        "a" * 12, "s3://b/wh", job_configs={"label-column": "label", "eval-days": "1"}
    )
    req = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    assert req.flags == (
        "--input-table=ctr.training_v1",
        "--start-ds=2026-07-07",
        "--end-ds=2026-07-10",
        f"--model-dir=s3://b/wh/models/listing_ctr_model/{'a' * 12}/2026-07-10",
        "--warehouse=s3://b/tables",
        "--label-column=label",
        "--eval-days=1",
    )
    assert req.entrypoint.startswith("python -m trainer.train --input-table=ctr.training_v1 ")
    assert req.job_key == f"listing_ctr_model-{'a' * 12}-2026-07-10"


def test_derived_flags_overridable_once() -> None:
    model = make_model(
        "a" * 12, "s3://b/wh", job_configs={"model-dir": "s3://x/m", "warehouse": "s3://x/t"}
    )
    req = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    assert req.model_dir == "s3://x/m" and req.warehouse == "s3://x/t"
    assert [f for f in req.flags if f.startswith("--model-dir")] == ["--model-dir=s3://x/m"]
    assert [f for f in req.flags if f.startswith("--warehouse")] == ["--warehouse=s3://x/t"]


def test_values_with_spaces_are_quoted_in_the_entrypoint() -> None:
    model = make_model("a" * 12, "file:///wh", job_configs={"note": "two words; rm -rf /"})
    req = build_training_request(model, "2026-07-10", warehouse="file:///wh")
    assert "'--note=two words; rm -rf /'" in req.entrypoint


def test_bad_partition_key_refused() -> None:
    with pytest.raises(ValueError):
        build_training_request(
            make_model("a" * 12, "file:///wh"), "July 10", warehouse="file:///wh"
        )


def test_for_attempt_points_the_trainer_at_its_own_folder() -> None:
    model = make_model("a" * 12, "s3://b/wh", job_configs={})
    req = build_training_request(model, "2026-07-10", warehouse="s3://b/t")
    job = req.for_attempt("zd-x-1")
    canonical = f"s3://b/wh/models/listing_ctr_model/{'a' * 12}/2026-07-10"
    assert job.canonical_dir == req.model_dir == canonical
    assert job.model_dir == f"{canonical}/_attempts/zd-x-1" and job.attempt_id == "zd-x-1"
    assert f"--model-dir={canonical}/_attempts/zd-x-1" in job.flags
    assert [f for f in job.flags if f.startswith("--model-dir")] == [
        f"--model-dir={canonical}/_attempts/zd-x-1"
    ]


def test_a_range_job_is_named_by_its_span_and_by_its_days_when_some_are_left_out() -> None:
    """Every day of a span: the job is named by its first and last day. Some days only (a
    backfill of chosen days, a retry that reuses some): a hash of the days is added, so a
    run never re-attaches to a live job that trains another set of partitions."""
    from zipline_dagster.jobs.request import (
        build_range_request,
    )

    model = make_model("a" * 12, "s3://b/wh")

    def key(*days: str) -> str:
        return build_range_request(
            [build_training_request(model, d, warehouse="s3://b/tables") for d in days]
        ).job_key

    span = f"listing_ctr_model-{'a' * 12}-2026-07-10_2026-07-12"
    every = key("2026-07-10", "2026-07-11", "2026-07-12")
    ends = key("2026-07-10", "2026-07-12")
    assert every == span
    assert ends.startswith(f"{span}-") and len(ends) == len(span) + 9
    assert ends == key("2026-07-10", "2026-07-12")  # the same days: the same job
    assert key("2026-07-10", "2026-07-12") != key("2026-07-10", "2026-07-11", "2026-07-12")


def test_promotion_commits_with_the_manifest_last(file_base: str) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    _attempt(store, d, "a1", {"model.json": b"{}"})
    with pytest.raises(ArtifactError, match="wrote no metrics.json"):
        promote_attempt(store, d, "a1", extra={})
    assert not model_partition(store, d, checksums=True).committed
    assert not store.exists(f"{d}/model.json")  # nothing copied for a bad attempt
    _attempt(store, d, "a1", {"metrics.json": b'{"train": {}}'})
    p = promote_attempt(store, d, "a1", extra={"model": "m"})
    assert p.manifest.paths == ["metrics.json", "model.json"]
    assert p.manifest.attempt == "a1" and p.superseded is None and not p.already
    assert model_partition(store, d, checksums=True).committed
    # promoting the same attempt again (a second run attached to the same job) is a no-op
    again = promote_attempt(store, d, "a1", extra={"model": "m"})
    assert again.already and again.manifest == p.manifest
    store.write_bytes(f"{d}/model.json", b"changed after commit")
    assert not model_partition(store, d, checksums=True).committed
    assert model_partition(store, d).committed  # the cheap check sees files only


def test_a_later_attempt_supersedes_and_an_old_one_cannot_come_back(file_base: str) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    _attempt(store, d, "a1", {"metrics.json": b'{"v": 1}', "sub/model.bin": b"1"})
    promote_attempt(store, d, "a1", extra={})
    _attempt(store, d, "a2", {"metrics.json": b'{"v": 2}'})
    p2 = promote_attempt(store, d, "a2", extra={})
    assert p2.superseded is not None and p2.superseded.startswith(f"{d}/_superseded/")
    assert json.loads(store.read_bytes(f"{p2.superseded}/metrics.json")) == {"v": 1}
    assert store.exists(f"{p2.superseded}/sub/model.bin")
    assert store.exists(f"{p2.superseded}/{MANIFEST_NAME}")
    assert not store.exists(f"{d}/sub/model.bin")  # the finished model is a2's alone
    # a late run of a1 finds it promoted and superseded since: nothing moves
    with pytest.raises(ArtifactError, match="has since been superseded"):
        promote_attempt(store, d, "a1", extra={})
    assert json.loads(store.read_bytes(f"{d}/metrics.json")) == {"v": 2}


@pytest.mark.parametrize("where", ["file", "s3", "gs", "abfss"])
def test_promotion_streams_a_large_model_without_holding_it(
    where: str, request: pytest.FixtureRequest
) -> None:
    """Promoting, superseding and verifying a partition stream its files: a model of 64 MB
    never sits whole in the step's memory (Python's allocations peak at a few chunks),
    and the manifest holds the digest and size of what landed."""
    import hashlib
    import tracemalloc

    base = str(request.getfixturevalue(BUCKETS[where]))
    d = f"{base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    model = os.urandom(64 << 20)
    _attempt(store, d, "a1", {"metrics.json": b"{}", "model.bin": model})
    _attempt(store, d, "a2", {"metrics.json": b"{}", "model.bin": model[::-1]})
    del model
    tracemalloc.start()
    try:
        first = promote_attempt(store, d, "a1", extra={})
        second = promote_attempt(store, d, "a2", extra={})  # supersedes a1's 64 MB
        assert model_partition(
            store, d, checksums=True
        ).committed  # reads every byte for its digest
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB of Python allocations"
    entry = {f.path: f for f in second.manifest.files}["model.bin"]
    data = store.read_bytes(f"{d}/model.bin")
    assert entry == ManifestFile("model.bin", hashlib.sha256(data).hexdigest(), 64 << 20)
    assert second.superseded is not None
    old = {f.path: f for f in first.manifest.files}["model.bin"]
    assert store.sha256(f"{second.superseded}/model.bin") == (old.sha256, old.bytes)


def test_promotion_lock_excludes_and_breaks_when_stale(file_base: str) -> None:
    import time

    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    with promotion_lock(store, d):
        assert not store.create_exclusive(f"{d}/_PROMOTING.lock", b"x")
        with (
            pytest.raises(ArtifactError, match="held by another run"),
            promotion_lock(store, d, wait_s=0.5),
        ):
            pass
    assert not store.exists(f"{d}/_PROMOTING.lock")
    # a lock left by a run that died long ago is broken
    store.write_bytes(f"{d}/_PROMOTING.lock", json.dumps({"at": time.time() - 3600}).encode())
    with promotion_lock(store, d, stale_s=60):
        pass


def test_supersede_moves_everything_and_manifest_first(file_base: str) -> None:
    d = f"{file_base}/models/m/{'a' * 12}/2026-07-10"
    store = blob_store(d)
    assert supersede_previous(store, d) is None
    _attempt(store, d, "a1", {"metrics.json": b"{}", "sub/model.bin": b"1"})
    promote_attempt(store, d, "a1", extra={})
    dest = supersede_previous(store, d)
    assert dest is not None and dest.startswith(f"{d}/_superseded/")
    assert not model_partition(store, d, checksums=True).committed
    assert sorted(u[len(dest) + 1 :] for u in store.list(dest)) == [
        MANIFEST_NAME,
        "metrics.json",
        "sub/model.bin",
    ]
    skip = ("/_superseded/", "/_attempts/")
    assert [u for u in store.list(d) if not any(s in u for s in skip)] == []
    # a second supersede keeps both generations
    store.write_bytes(f"{d}/metrics.json", b"{}")
    dest2 = supersede_previous(store, d)
    assert dest2 != dest and json.loads(store.read_bytes(f"{dest2}/metrics.json")) == {}
    assert store.exists(f"{dest}/sub/model.bin")


def test_the_driver_is_told_where_to_write_its_end_marker() -> None:
    """A job runs under the archive's driver, told where to write its end marker (single
    partitions and ranges alike)."""
    import shlex

    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
    from zipline_dagster.jobs.request import (
        build_range_request,
    )

    runner = RayJobRunner(address="http://127.0.0.1:1")  # never contacted
    model = make_model("a" * 12, "s3://b/wh")
    one = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    both = build_range_request(
        [one, build_training_request(model, "2026-07-11", warehouse="s3://b/tables")]
    )
    root = f"s3://b/wh/models/listing_ctr_model/{'a' * 12}/2026-07-10/_attempts"
    for request, sid in ((one, "zd-x-1"), (both, "zd-range-1")):
        argv = shlex.split(runner.entrypoint(request, sid))
        assert argv[:3] == ["python", "-m", "zipline_runtime.driver"]
        assert f"--done-uri={root}/{sid}.done" in argv


def test_scoring_runs_under_the_driver_with_its_marker_beside_the_scores() -> None:
    """A scores day runs under the archive's driver (``--attempt-flag=write-id``: the
    attempt names the file it writes), its end marker in the scores partition's folder,
    never the model's; a scores range names its job by its days and by every day's flags
    (the model partition that scores it)."""
    from tests.support.scoring import transforms_for
    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
    from zipline_dagster.jobs.request import (
        JobRequest,
        build_range_request,
    )
    from zipline_dagster.scoring.days import Chosen, scoring_request

    model = make_model("a" * 12, "s3://b/wh")
    t = transforms_for(model)
    model_dir = f"s3://b/wh/models/listing_ctr_model/{'a' * 12}"

    def day(ds: str, model_ds: str) -> JobRequest:
        chosen = Chosen(f"{model_dir}/{model_ds}", "a" * 12, model_ds, "test")
        return scoring_request(t, ds, warehouse="s3://b/tables", model=chosen)

    one = day("2026-07-11", "2026-07-10")
    runner = RayJobRunner(address="http://127.0.0.1:1")  # never contacted
    argv = shlex.split(runner.entrypoint(one, "zd-s-1"))
    assert argv[:4] == ["python", "-m", "zipline_runtime.driver", "--attempt-id=zd-s-1"]
    assert "--module=trainer.score" in argv and "--attempt-flag=write-id" in argv
    scores = "s3://b/tables/ctr/listing_ctr_model_scores/_jobs/ds=2026-07-11"
    assert f"--done-uri={scores}/_attempts/zd-s-1.done" in argv
    spec = json.loads(next(a for a in argv if a.startswith("--partitions="))[13:])
    assert f"--model-dir={model_dir}/2026-07-10" in spec["2026-07-11"]  # never an attempt

    both = build_range_request([one, day("2026-07-12", "2026-07-11")], key_prefix="score-x")
    assert both.job_key.startswith("score-x-2026-07-11_2026-07-12-")
    other_model = build_range_request([one, day("2026-07-12", "2026-07-10")], key_prefix="score-x")
    assert other_model.job_key != both.job_key  # another model for a day: another job
    argv = shlex.split(runner.entrypoint(both, "zd-r-1"))
    assert (
        "--attempt-flag=write-id" in argv and f"--done-uri={scores}/_attempts/zd-r-1.done" in argv
    )
    spec = json.loads(next(a for a in argv if a.startswith("--partitions="))[13:])
    assert sorted(spec) == ["2026-07-11", "2026-07-12"]
    assert "--write-id=pending" in spec["2026-07-12"]  # the driver names it per attempt


@pytest.mark.s3
@pytest.mark.parametrize("where", ["file", "s3"])
def test_end_marker_watcher_sees_the_file_appear_and_rides_out_errors(
    where: str, request: pytest.FixtureRequest
) -> None:
    import threading

    from zipline_dagster.jobs.launchers.ray_follow import done_watcher

    base = str(request.getfixturevalue(BUCKETS[where]))
    uri = f"{base}/m/_attempts/zd-x-1.done"
    seen = threading.Event()
    watcher = done_watcher(uri, seen)
    watcher.start()
    try:
        assert not seen.wait(1.2)  # nothing there yet: no signal
        blob_store(base).write_bytes(uri, b"zipline-partitions-done 1 of 1")
        assert seen.wait(10)
    finally:
        watcher.stop()
    if where != "s3":
        return
    # On an object store a look costs requests: looks are 0.5 s apart while the job is
    # young, then 5% of its time so far (at most 5 s). A job 60 s old is looked for every
    # 3 s, where every 0.5 s would be 12 looks in these 6 s (and 7,200 in an hour's job).
    young, old = f"{base}/m/_attempts/zd-x-2.done", f"{base}/m/_attempts/zd-x-3.done"
    with s3_requests(os.environ["AWS_ENDPOINT_URL"]) as seen_requests:
        watchers = [
            done_watcher(young, threading.Event()),
            done_watcher(old, threading.Event(), job_start=time.time() - 60),
        ]
        for w in watchers:
            w.start()
        time.sleep(6)
        for w in watchers:
            w.stop()
    looks = Counter(name for _, name in seen_requests)  # one request a look (a GET)
    assert 10 <= looks["zd-x-2.done"] <= 13, seen_requests
    assert 2 <= looks["zd-x-3.done"] <= 3, seen_requests
    # A bucket that does not exist on the S3 server never sets it, nor raises.
    broken = threading.Event()
    watcher = done_watcher("s3://no-such-bucket-zd/x.done", broken)
    watcher.start()
    assert not broken.wait(1.2)
    watcher.stop()


def test_jobs_with_a_pip_env_may_write_bytecode_into_it() -> None:
    """Ray's pip env is a copy of the cluster's environment without .pyc files: its jobs
    are allowed to write them there (PYTHONDONTWRITEBYTECODE empty), so only the first
    process compiles; jobs without a pip env leave the cluster's setting alone, and a
    model's own env wins."""
    from dataclasses import replace

    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner

    model = make_model("a" * 12, "s3://b/wh")
    request = build_training_request(model, "2026-07-10", warehouse="s3://b/tables")
    runner = RayJobRunner(address="http://127.0.0.1:1")  # never contacted
    env = runner.runtime_env(request, ["xgboost-cpu==3.2.0"])
    assert env["pip"]["packages"] == ["xgboost-cpu==3.2.0"]
    assert env["env_vars"]["PYTHONDONTWRITEBYTECODE"] == ""
    assert "PYTHONDONTWRITEBYTECODE" not in runner.runtime_env(request, [])["env_vars"]
    no_install = RayJobRunner(address="http://127.0.0.1:1", install_requirements=False)
    assert "PYTHONDONTWRITEBYTECODE" not in no_install.runtime_env(request, ["x"])["env_vars"]
    own = replace(request, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert runner.runtime_env(own, ["x"])["env_vars"]["PYTHONDONTWRITEBYTECODE"] == "1"


def test_a_partition_run_in_the_driver_keeps_only_the_tail_of_its_output(
    tmp_path: Path,
) -> None:
    """A single-partition job runs its trainer in the driver: the output goes to the
    job's log as it comes, and the driver keeps only its end (for a failure's tail), not
    everything a trainer prints over hours."""
    (tmp_path / "chatty.py").write_text(
        "import sys\nfor i in range(200_000):\n    print(f'line {i} ' + 'x' * 40)\nsys.exit(3)\n"
    )
    spec = json.dumps({"2026-07-10": []})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zipline_runtime.driver",
            "--attempt-id=zd-chatty-1",
            "--module=chatty",
            "--in-process",
            f"--partitions={spec}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("line ") for line in lines) == 200_000  # all of it streamed
    result = json.loads(next(x for x in lines if x.startswith(RESULT_PREFIX))[len(RESULT_PREFIX) :])
    assert result["exit_code"] == 3
    tail = result["tail"].splitlines()
    assert len(tail) == TAIL_LINES and tail[-1].startswith("line 199999 ")
    assert tail[0].startswith(f"line {200_000 - TAIL_LINES} ")

    # what the driver held: about TAIL_CHARS of the end, not the 10 MB printed
    held = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from zipline_runtime.driver import run_partition; "
            "r = run_partition('chatty', [], tail_chars=4096); "
            "sys.stderr.write(f\"{len(r['log'])} {r['log'].splitlines()[-1][:11]}\")",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    size, last = held.stderr.split(" ", 1)
    assert int(size) <= 4096 and last == "line 199999"


def test_the_drivers_end_marker_holds_every_result_line(tmp_path: Path) -> None:
    """The driver writes each partition's result line into its end marker on storage
    too, before its last line: a step handed an incomplete log still learns every
    partition's outcome (the real driver, two partitions, one failing)."""
    from zipline_runtime.driver import DONE_PREFIX, partition_results

    (tmp_path / "fails_on_ninth.py").write_text(
        "import sys\nprint('training', sys.argv[1:])\nsys.exit(4 if '--day=09' in sys.argv else 0)\n"
    )
    marker = f"file://{tmp_path}/out/_attempts/zd-x-1.done"
    spec = json.dumps({"2026-07-08": ["--day=08"], "2026-07-09": ["--day=09"]})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zipline_runtime.driver",
            "--attempt-id=zd-x-1",
            "--module=fails_on_ninth",
            "--in-process",
            f"--partitions={spec}",
            f"--done-uri={marker}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    stored = (tmp_path / "out" / "_attempts" / "zd-x-1.done").read_text()
    assert partition_results(stored) == partition_results(proc.stdout)
    assert {ds: r["exit_code"] for ds, r in partition_results(stored).items()} == {
        "2026-07-08": 0,
        "2026-07-09": 4,
    }
    assert stored.splitlines()[-1] == proc.stdout.splitlines()[-1]
    assert stored.splitlines()[-1].startswith(f"{DONE_PREFIX}1 of 2 partitions succeeded")


def test_the_logged_command_sums_up_a_range_but_keeps_anything_else_whole() -> None:
    from zipline_dagster.jobs.channel import loggable_command

    flags = ["--start-ds=2026-08-02", "--model-dir=file:///w/m/v/x"]
    one = shlex.join(["python", "-m", "m", f"--partitions={json.dumps({'2026-08-05': flags})}"])
    assert loggable_command(one) == one  # one partition: its flags are the command
    days = {f"2026-08-{d:02d}": flags for d in (5, 6, 9)}
    many = shlex.join(["python", "-m", "m", f"--partitions={json.dumps(days)}", "--done-uri=x y"])
    assert loggable_command(many) == (
        "python -m m --partitions=<3 partitions, 2026-08-05..2026-08-09, each with its own "
        "flags: the job's page in the Ray dashboard shows them> '--done-uri=x y'"
    )
    for other in ("python train.py --partitions='{", "python -m m --partitions=[1,2]"):
        assert loggable_command(other) == other  # not a range spec: as it is


def test_a_promotion_whose_copies_cannot_be_deleted_is_committed(s3_bucket: str) -> None:
    """On S3 as a role allowed to write but not to delete (a proxy answering every DELETE
    with S3's 403): the manifest commits the partition; the attempt's copied files and
    the lock stay behind, named, and the promotion does not fail (Dagster records what
    storage holds); the attempt's note, which keeps a late run from promoting it again
    over a newer one, is written."""
    from tests.helpers import s3_through_proxy

    d = f"{s3_bucket}/models/m/{'a' * 12}/2026-07-10"
    with s3_through_proxy() as proxy:
        store = blob_store(d)
        _attempt(store, d, "a1", {"metrics.json": b'{"train": {}}', "model.json": b"{}"})
        proxy.deny("DELETE")
        p = promote_attempt(store, d, "a1", extra={})
        assert proxy.denied >= 3
        assert model_partition(store, d, checksums=True).committed and p.manifest.attempt == "a1"
        adir = attempt_dir(d, "a1")
        assert sorted(p.left_behind) == sorted(
            [f"{adir}/metrics.json", f"{adir}/model.json", f"{d}/{PROMOTE_LOCK_NAME}"]
        )
        assert store.exists(f"{adir}/{PROMOTED_NAME}")


@pytest.mark.timeout(120)  # without the fix: the run waits on its own lock (900 s), then fails
def test_a_promotion_whose_lock_answer_is_lost_goes_on(s3_bucket: str) -> None:
    """On S3, the lock's conditional put lands and its answer is lost (a proxy resets the
    connection in place of it); the SDK's retry is told the lock is taken, by this very
    run. The run knows its own lock (it holds the run's bytes): the promotion commits at
    once and releases the lock, rather than waiting on itself until the lock is stale."""
    from tests.helpers import s3_through_proxy

    d = f"{s3_bucket}/models/m/{'a' * 12}/2026-07-11"
    with s3_through_proxy() as proxy:
        store = blob_store(d)
        _attempt(store, d, "a1", {"metrics.json": b'{"train": {}}', "model.json": b"{}"})
        proxy.lose_answers("PUT", count=1)  # the first PUT: the lock
        p = promote_attempt(store, d, "a1", extra={})
        assert proxy.lost == 1
        assert (
            model_partition(store, d, checksums=True).committed
            and p.manifest.attempt == "a1"
            and not p.left_behind
        )
        assert not store.exists(f"{d}/{PROMOTE_LOCK_NAME}")


def test_a_lock_whose_holder_was_killed_is_broken_at_once(file_base: str) -> None:
    """A process holding the promotion lock is killed with kill -9 (a step killed
    mid-promotion): the next promotion on this machine sees its holder has ended and
    takes the lock at once, not after 600 s. A live holder's lock is waited on, and so is
    one whose holder this machine cannot check (another host), however recent."""
    import signal

    d = f"{file_base}/models/m/{'a' * 12}/2026-07-12"
    lock = f"{d}/{PROMOTE_LOCK_NAME}"
    store = blob_store(d)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from zipline_dagster.storage.blobs import blob_store\n"
            "from zipline_dagster.storage.artifacts import promotion_lock\n"
            f"with promotion_lock(blob_store({d!r}), {d!r}):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(300)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with (  # alive: waited on
            pytest.raises(ArtifactError, match="held by another run"),
            promotion_lock(store, d, wait_s=1.0),
        ):
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert store.exists(lock)  # left by the killed holder
    killed = json.loads(store.read_bytes(lock))
    with promotion_lock(store, d, wait_s=1.0):  # within a second, not 600
        assert json.loads(store.read_bytes(lock))["pid"] == os.getpid()
    assert not store.exists(lock)

    # the same dead holder, as another host would have named it: not checkable from here
    elsewhere = {**killed, "host": "another-host", "at": time.time()}
    store.write_bytes(lock, json.dumps(elsewhere).encode())
    with (
        pytest.raises(ArtifactError, match="held by another run"),
        promotion_lock(store, d, wait_s=1.0),
    ):
        pass
    assert store.exists(lock)


def test_the_trainer_and_the_platform_name_the_same_attempts_folder() -> None:
    """The trainer side (shipped in every archive, importing nothing of the platform) and
    the artifact protocol on storage each name the attempts folder; they must agree."""
    from zipline_runtime import driver as channel

    from zipline_dagster.storage import manifests

    assert channel.ATTEMPTS_DIR == manifests.ATTEMPTS_DIR == "_attempts"
