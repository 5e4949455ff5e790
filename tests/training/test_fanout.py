"""Many small models from one table: every segment gets a model or a reported failure."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_partition
from tests.support.fanout import market_rows, write_market_table
from tests.support.training import (
    DS,
    TABLE,
    make_model,
    materialize,
    only_materialization,
    resources,
)
from zipline_dagster.declarations.model import ResourceConfig
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.storage.blobs import blob_store

SEGMENTS = 300


def publish_market_trainer(base: str) -> str:
    """Publishes the fan-out trainer's archive under ``base``; its version."""
    return publish_trainer_archive(
        TRAINERS / "market_ctr_models", model_name="market_ctr_models", base=base
    ).version


def test_fan_out_trains_every_segment_or_reports_it(launcher: str | None, file_base: str) -> None:
    write_market_table(file_base, SEGMENTS)
    version = publish_market_trainer(file_base)
    jc = {
        "segment-column": "market",
        "label-column": "label",
        "eval-days": "1",
        "features": "price,noise",
        "num-rounds": "10",
    }
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc)
    result = materialize(model, resources(launcher, file_base))
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["segments/total"] == SEGMENTS + 1
    assert md["segments/trained"] == SEGMENTS and md["segments/failed"] == 1
    assert "empty split" in md["segments/failures"]["zz_new_market"]
    table = {r.data["segment"]: r.data for r in md["segments/summary"].records}
    assert len(table) == SEGMENTS + 1 and table["zz_new_market"]["status"] == "failed"
    assert md["holdout/auc_median"] > 0.6  # each market has a real price signal

    model_dir = md["artifact_uri"]
    store = blob_store(model_dir)
    report = json.loads(store.read_bytes(f"{model_dir}/metrics.json"))
    assert report["executor"] == ("ray" if launcher else "serial")
    # A second of work on Ray is shorter than a worker's start: the driver trains it alone
    # and no worker is asked for (--min-pool-seconds); see the test below for the pool.
    assert report["segments_by_driver"] == SEGMENTS + 1 and report["pool_workers"] == 0
    assert report["pool_first_up_seconds"] is None and report["segments_before_pool_up"] == 0
    # reading and splitting took time and CPU (the bench's ceiling counts that CPU), and
    # the trainer's time is that plus the fan-out
    assert report["load_seconds"] > 0 and report["load_cpu_seconds"] > 0
    assert report["train_seconds"] == pytest.approx(
        report["load_seconds"] + report["fanout_seconds"], abs=0.002
    )
    with zipfile.ZipFile(io.BytesIO(store.read_bytes(f"{model_dir}/segment_models.zip"))) as zf:
        models = {n.removesuffix(".ubj") for n in zf.namelist()}
    assert models | set(report["segments_failed"]) == set(table)
    assert not models & set(report["segments_failed"])


@pytest.mark.ray
def test_pool_workers_share_the_work_with_the_driver(ray_head: Any, file_base: str) -> None:
    """With the pool forced on (--min-pool-seconds=0) and about 20 s of training for the
    driver alone (a worker starts in about 5 s here), a pool worker comes up while the
    driver trains and takes part of the segments; every segment still gets its model or
    its reported failure, whoever trained it. The model declares no replicas (the
    default): its driver holds one of the head's 2 CPUs and a worker gets the other."""
    segments = 3000
    write_market_table(file_base, segments)
    version = publish_market_trainer(file_base)
    jc = {"segment-column": "market", "features": "price,noise", "min-pool-seconds": "0"}
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc)
    # the default's pip env (the suite turns it off: tests/conftest.py)
    res = resources(ray_head.dashboard_url, file_base, install_requirements=True)
    result = materialize(model, res)
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["segments/trained"] == segments and md["segments/failed"] == 1
    report = json.loads(blob_store(file_base).read_bytes(f"{md['artifact_uri']}/metrics.json"))
    assert report["pool_workers"] == 1
    assert 0 < report["segments_by_driver"] < segments + 1  # both slots trained
    # the driver saw the worker up part-way, having trained some segments alone before
    assert 0 < report["pool_first_up_seconds"] < report["fanout_seconds"]
    assert 0 < report["segments_before_pool_up"] < segments + 1
    assert "empty split" in report["segments_failed"]["zz_new_market"]
    # Ray's pip env is a copy of the environment made without .pyc files, and the head
    # runs with PYTHONDONTWRITEBYTECODE=1: the jobs' processes still wrote the bytecode of
    # what they imported into it, so the next job's processes do not compile it again.
    compiled = Path(ray_head.temp_dir).glob(
        "session_*/runtime_resources/pip/*/virtualenv/lib/python3*/site-packages/"
        "xgboost/__pycache__/core.*.pyc"
    )
    assert list(compiled), "no bytecode in Ray's pip env"


@pytest.mark.ray
def test_a_driver_training_alone_uses_the_jobs_slots_as_threads(
    ray_head: Any, file_base: str
) -> None:
    """A job too short for a worker's start (300 segments, about a second): the driver
    trains it alone on the model's 2 slots as threads, and the models are exactly those
    of the serial loop, byte for byte, the failing segment reported the same way."""
    from ray.job_submission import JobSubmissionClient

    write_market_table(file_base, SEGMENTS)
    version = publish_market_trainer(file_base)
    out = {}
    for executor in ("serial", "ray"):
        jc = {"segment-column": "market", "features": "price,noise", "executor": executor}
        model = make_model(version, file_base, name="market_ctr_models", job_configs=jc, replicas=2)
        md = only_materialization(materialize(model, resources(ray_head.dashboard_url, file_base)))
        model_dir = str(md.metadata["artifact_uri"].value)
        store = blob_store(model_dir)
        report = json.loads(store.read_bytes(f"{model_dir}/metrics.json"))
        with zipfile.ZipFile(io.BytesIO(store.read_bytes(f"{model_dir}/segment_models.zip"))) as zf:
            models = {n: zf.read(n) for n in zf.namelist()}
        logs = JobSubmissionClient(ray_head.dashboard_url).get_job_logs(
            str(md.metadata["ray_job_id"].value)
        )
        out[executor] = (report, models, logs)
    (serial, serial_models, _), (ray, ray_models, logs) = out["serial"], out["ray"]
    assert serial["driver_threads"] == 1
    assert ray["driver_threads"] == 2 and ray["pool_workers"] == 0
    assert "no workers started; it trains them on 2 threads" in logs
    assert len(ray_models) == SEGMENTS and ray_models == serial_models
    assert ray["segments"] == serial["segments"]  # every segment's metrics, in order
    assert ray["segments_failed"] == serial["segments_failed"]
    assert "empty split" in ray["segments_failed"]["zz_new_market"]


def run_in_trainer(
    code: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``code`` run by Python in the fan-out trainer's folder (its ``trainer`` package
    importable), with ``env`` (default: this process's environment)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=TRAINERS / "market_ctr_models",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_driver_threads_follow_the_slots_or_the_cpus_ray_reserved() -> None:
    """Without --driver-threads the driver's threads are the job's slots (--num-workers)
    when given, else the CPUs Ray reserved for the driver (OMP_NUM_THREADS, which Ray sets
    for a job's entrypoint); never more than the node's CPUs. A consumer that stops
    reading the results stops the training: the batches not begun are dropped."""
    code = (
        "import numpy as np\n"
        "from trainer.fanout import driver_threads, local_cpus, train_threaded\n"
        "print(local_cpus(), driver_threads(0, 0), driver_threads(0, 2), driver_threads(0, 64),"
        " driver_threads(3, 2))\n"
        "class Counted(dict):\n"
        "    reads = 0\n"
        "    def __getitem__(self, key):\n"
        "        Counted.reads += 1\n"
        "        return super().__getitem__(key)\n"
        "arrays = {'x': np.arange(40.0).reshape(20, 2), 'y': np.arange(20) % 2,"
        " 'hold': np.arange(20) >= 15}\n"
        "data = Counted((f's{i:04d}', arrays) for i in range(2000))\n"
        "results = train_threaded(sorted(data), data, {'max_depth': 2, 'num_rounds': 2}, 2)\n"
        "first = next(results)\n"
        "results.close()\n"
        "print(first['segment'], Counted.reads < 2000)\n"
    )

    def run(omp: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        res = run_in_trainer(code, {**env, **({"OMP_NUM_THREADS": omp} if omp else {})})
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    cpus, alone, two, many, given, first, stopped = run("2")
    assert int(cpus) == len(os.sched_getaffinity(0))
    assert (alone, two, many, given) == (
        str(min(2, int(cpus))),
        str(min(2, int(cpus))),
        str(min(4, int(cpus))),
        "3",
    )
    assert (first, stopped) == ("s0000", "True")
    assert run("")[1] == "1"  # no reservation said: one thread


def test_the_split_gives_each_segment_its_rows_without_copying_the_table_twice() -> None:
    """Each segment gets exactly its rows, in their order, every feature as float64
    (integers and booleans too), its labels and which rows are holdout rows; the split
    allocates little besides what it returns (numpy's allocations, traced): no second
    or third copy of the feature matrix on the way (on 10k models of 500 rows and 20
    features, 160 MB each)."""
    code = (
        "import tracemalloc, types\n"
        "import numpy as np, pyarrow as pa\n"
        "from trainer.train import segment_codes, split_by_segment\n"
        "rng = np.random.default_rng(0)\n"
        "n, k = 60_000, 16\n"
        "market = np.array([f'm{i:03d}' for i in rng.integers(0, 300, n)])\n"
        "day = np.array(['2026-07-09', '2026-07-10'])[rng.integers(0, 2, n)]\n"
        "feats = {f'f{j}': rng.normal(0, 1, n) for j in range(k - 2)}\n"
        "feats['count'] = rng.integers(0, 9, n)\n"
        "feats['flag'] = rng.random(n) < 0.5\n"
        "head = pa.table({'market': pa.array(market).dictionary_encode(),\n"
        "    'label': rng.integers(0, 2, n), 'ds': pa.array(day).dictionary_encode()})\n"
        "body = pa.table(feats)\n"
        "args = types.SimpleNamespace(input_table='t', label_column='label',"
        " partition_column='ds')\n"
        "codes, names = segment_codes(head, 'market')\n"
        "tracemalloc.start()\n"
        "out = split_by_segment(head, body, codes, names, args, list(feats), ['2026-07-10'])\n"
        "held, peak = tracemalloc.get_traced_memory()\n"
        "tracemalloc.stop()\n"
        "full = np.column_stack([np.asarray(v, dtype='float64') for v in feats.values()])\n"
        "label = head.column('label').to_numpy()\n"
        "for name in names:\n"
        "    rows = market == name\n"
        "    got = out[name]\n"
        "    assert got['x'].dtype == np.float64 and np.array_equal(got['x'], full[rows]), name\n"
        "    assert np.array_equal(got['y'], label[rows]), name\n"
        "    assert np.array_equal(got['hold'], day[rows] == '2026-07-10'), name\n"
        "assert sorted(out) == names == sorted(set(market.tolist()))\n"
        "print(peak - held, full.nbytes)\n"
    )
    res = run_in_trainer(code)
    assert res.returncode == 0, res.stderr
    extra, matrix = map(int, res.stdout.split())
    # the row order (8 bytes a row) and the sort's keys (2) against the matrix's 128:
    # stacking the columns, then reordering them, made a full matrix more
    assert extra < matrix / 4, f"the split allocated {extra} bytes besides its result"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--max-in-flight=0", "--max-in-flight=0 is invalid; expected a whole number >= 1"),
        ("--driver-threads=-1", "--driver-threads=-1 is invalid; expected a whole number >= 0"),
        ("--min-pool-seconds=-1", "--min-pool-seconds=-1.0 is invalid; expected seconds >= 0"),
        ("--min-pool-seconds=nan", "--min-pool-seconds=nan is invalid; expected seconds >= 0"),
    ],
)
def test_bad_pool_flags_are_refused_by_name(tmp_path: Path, flag: str, message: str) -> None:
    res = run_trainer(tmp_path, flag)
    assert res.returncode == 2
    assert message in res.stderr
    assert not (tmp_path / "model").exists()  # nothing written


def run_trainer(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The fan-out trainer run by hand (serial unless ``flags`` say otherwise) on the table
    under ``tmp_path``, with ``env`` added to this process's environment."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.train",
            f"--input-table={TABLE}",
            f"--start-ds={days_ending(DS, 4)[0]}",
            f"--end-ds={DS}",
            f"--model-dir={tmp_path.as_uri()}/model",
            f"--warehouse={tmp_path.as_uri()}",
            "--executor=serial",
            *flags,
        ],
        cwd=TRAINERS / "market_ctr_models",
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("closed port", "the Ray worker pool was still starting 10s after the driver had trained"),
        ("nonsense", "could not start the Ray worker pool: Invalid address format: nonsense"),
    ],
)
def test_a_pool_that_cannot_start_leaves_the_driver_training_alone(
    tmp_path: Path, address: str, reason: str
) -> None:
    """Workers asked for (--executor=ray, --min-pool-seconds=0) where no Ray answers: at a
    closed loopback port ray.init retries for ever, a malformed address fails it at once.
    Either way the driver trains every segment itself and the run ends, the reason in its
    log and report: not a run that hangs on the pool's start, nor one that fails although
    every model could be trained."""
    if address == "closed port":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{sock.getsockname()[1]}"
    segments = 200
    write_market_table(tmp_path.as_uri(), segments)
    res = run_trainer(
        tmp_path, "--executor=ray", "--min-pool-seconds=0", env={"RAY_ADDRESS": address}
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert report["segments_trained"] == segments
    assert list(report["segments_failed"]) == ["zz_new_market"]
    assert report["pool_workers"] == 0 and report["segments_by_driver"] == segments + 1
    assert report["pool_error"].startswith(reason)
    assert f"fan-out: {reason}" in res.stdout


def test_a_pool_of_one_slot_leaves_the_driver_training_alone(tmp_path: Path) -> None:
    """--num-workers=1: the driver is the only slot, so no worker is started (nor Ray
    asked for one) and the log says why, not a fan-out with "0 of 0 workers up"."""
    segments = 200
    write_market_table(tmp_path.as_uri(), segments)
    env = {"RAY_ADDRESS": "nonsense"}  # never used: nothing connects to Ray
    res = run_trainer(
        tmp_path, "--executor=ray", "--min-pool-seconds=0", "--num-workers=1", env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert report["segments_trained"] == segments and report["pool_error"] is None
    assert report["pool_workers"] == 0 and report["segments_by_driver"] == segments + 1
    assert (
        "fan-out: one training slot (--num-workers=1): no workers started; the driver has "
        in res.stdout
    )


@pytest.mark.ray
def test_a_driver_holding_the_whole_cluster_trains_alone_on_its_cpus(
    ray_head: Any, file_base: str
) -> None:
    """A model whose driver asks for both of the head's CPUs (cpus_per_replica=2, no
    replicas) leaves no CPU for a worker: none is started (one would wait for a CPU for
    ever) and the driver trains on the 2 CPUs it holds, as threads."""
    from ray.job_submission import JobSubmissionClient

    write_market_table(file_base, SEGMENTS)
    version = publish_market_trainer(file_base)
    jc = {"segment-column": "market", "features": "price,noise", "min-pool-seconds": "0"}
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc)
    model = dataclasses.replace(
        model,
        training_conf=dataclasses.replace(
            model.training_conf, resource_config=ResourceConfig(cpus_per_replica=2)
        ),
    )
    md = only_materialization(materialize(model, resources(ray_head.dashboard_url, file_base)))
    model_dir = str(md.metadata["artifact_uri"].value)
    report = json.loads(blob_store(model_dir).read_bytes(f"{model_dir}/metrics.json"))
    assert report["segments_trained"] == SEGMENTS and report["pool_error"] is None
    assert report["pool_workers"] == 0 and report["driver_threads"] == 2
    logs = JobSubmissionClient(ray_head.dashboard_url).get_job_logs(
        str(md.metadata["ray_job_id"].value)
    )
    assert "one training slot (the cluster has no CPU free besides the driver's)" in logs
    assert "it trains them on 2 threads" in logs


@pytest.mark.ray
def test_a_driver_holding_two_cpus_trains_on_both_beside_its_workers(
    ray_head: Any, tmp_path: Path
) -> None:
    """A driver that holds two CPUs (Ray passes them as OMP_NUM_THREADS; here by hand,
    so the 2-CPU head has room for its worker) trains beside the pool's worker on two
    threads, not on one with the other CPU idle; the models are those of the serial loop,
    byte for byte."""
    write_market_table(tmp_path.as_uri(), SEGMENTS)
    env = {"RAY_ADDRESS": ray_head.gcs_address, "RAY_AUTH_MODE": "disabled"}
    fanned = run_trainer(
        tmp_path,
        "--executor=ray",
        "--min-pool-seconds=0",
        "--num-workers=2",
        env={**env, "OMP_NUM_THREADS": "2"},
    )
    assert fanned.returncode == 0, fanned.stdout + fanned.stderr
    report = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert report["pool_workers"] == 1 and report["driver_threads"] == 2
    assert report["segments_trained"] == SEGMENTS and report["pool_error"] is None
    assert 0 < report["segments_by_driver"] <= SEGMENTS + 1
    serial = run_trainer(tmp_path, f"--model-dir={tmp_path.as_uri()}/serial")
    assert serial.returncode == 0, serial.stdout + serial.stderr
    zips = [(tmp_path / d / "segment_models.zip").read_bytes() for d in ("model", "serial")]
    assert zips[0] == zips[1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--segment-column=region"],
            "has no column 'region' (--segment-column); it has "
            "['label', 'market', 'noise', 'price']",
        ),
        (
            ["--label-column=clicked"],
            "has no column 'clicked' (--label-column); it has "
            "['label', 'market', 'noise', 'price']",
        ),
        (["--features=price,margin"], "has no columns ['margin'] (--features)"),
    ],
)
def test_missing_columns_are_named(tmp_path: Path, flags: list[str], message: str) -> None:
    write_market_table(tmp_path.as_uri(), 5)
    res = run_trainer(tmp_path, *flags)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"training data error: table {TABLE} {message}" in res.stdout
    assert not (tmp_path / "model").exists()  # nothing written


def test_empty_labels_are_refused(tmp_path: Path) -> None:
    """A row without a label is an error naming the column and the count, not a label
    made up by a conversion (a null becomes an arbitrary integer in numpy)."""
    write_market_table(tmp_path.as_uri(), 5)
    frame = market_rows(DS, 5, 20)
    frame["label"] = pd.array([None, *frame["label"].iloc[1:]], dtype="Int64")
    write_partition(tmp_path.as_uri(), TABLE, DS, frame)
    res = run_trainer(tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (
        f"table {TABLE}: the label column 'label' (--label-column) has 1 empty rows; "
        "every row needs a 0/1 label"
    ) in res.stdout
    assert not (tmp_path / "model").exists()


def test_segments_keep_their_names_whatever_the_column_type(tmp_path: Path) -> None:
    """Integer segment ids and an empty segment value: one model per distinct value,
    named by its text (a null is "None"), every row in exactly one segment."""
    for ds in days_ending(DS, 4):
        frame = market_rows(ds, 3, 40)
        ids = frame["market"].str[1:].astype("int64") * 7 + 3  # 3, 10, 17
        frame["market"] = pd.array(
            [None if i % 40 == 0 else v for i, v in enumerate(ids)], dtype="Int64"
        )
        write_partition(tmp_path.as_uri(), TABLE, ds, frame)
    res = run_trainer(tmp_path, "--features=price,noise", "--num-rounds=2")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "model" / "metrics.json").read_text())
    rows = {s["segment"]: s["train_rows"] + s["holdout_rows"] for s in report["segments"]}
    # each market loses its first row of each day to the empty value
    assert rows == {"10": 4 * 39, "17": 4 * 39, "3": 4 * 39, "None": 4 * 3}
    assert report["segments_total"] == 4 and not report["segments_failed"]


@pytest.mark.ray
def test_batches_queued_on_a_worker_that_never_starts_come_back(
    ray_head: Any, file_base: str
) -> None:
    """Batches are queued on a worker as soon as it is asked for. Asked for more workers
    than the 2-CPU cluster can place (--num-workers=4: three workers of one CPU each), one
    worker never starts: once the driver has nothing else to train it takes that worker's
    batches back and trains them itself, and the job ends with every segment trained or
    reported, instead of waiting for a CPU that never frees."""
    from ray.job_submission import JobSubmissionClient

    segments = 3000  # about 20 s for the driver alone: time enough for two workers to start
    write_market_table(file_base, segments)
    version = publish_market_trainer(file_base)
    jc = {
        "segment-column": "market",
        "features": "price,noise",
        "min-pool-seconds": "0",
        "num-workers": "4",
    }
    model = make_model(version, file_base, name="market_ctr_models", job_configs=jc, replicas=2)
    # the default's pip env (the suite turns it off: tests/conftest.py)
    res = resources(ray_head.dashboard_url, file_base, install_requirements=True)
    result = materialize(model, res)
    assert result.success
    md = {k: v.value for k, v in only_materialization(result).metadata.items()}
    assert md["segments/trained"] == segments and md["segments/failed"] == 1
    report = json.loads(blob_store(file_base).read_bytes(f"{md['artifact_uri']}/metrics.json"))
    assert report["pool_workers"] == 3
    logs = JobSubmissionClient(ray_head.dashboard_url).get_job_logs(str(md["ray_job_id"]))
    assert "a worker is still starting; the driver takes back its batches" in logs
    assert "of 3 workers up" in logs
    assert report["segments_by_driver"] < segments + 1  # the workers that fit did train
