"""Faults on the production topology (issue 39): ``scripts/cluster.py`` starts Postgres,
S3, a Ray head with two worker nodes, Spark and Dagster's daemon and webserver as their
own processes; the code location ``tests.cluster.topology_defs`` is deployed to them, and
work goes in as backfills through the webserver, which the daemon runs. Then real
processes are killed or restarted under it: the daemon, Postgres, a Ray worker node.

Every fault ends the same way: the backfill completes, the planner finds every partition
fresh (what Dagster recorded and what storage holds agree), every model partition's
manifest verifies, and no partition was ever trained by two Ray jobs at once.

One cluster serves the module; its services are recorded for the test run's cleanup and
stopped by ``Cluster.down`` (by PID, nothing else on the machine).
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import FIXTURE_TRAINERS, ROOT
from tests.helpers import days_ending, write_table

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.cluster]

#: half-second steps per training: long enough for a fault to land mid-training
STEPS = 16
MODEL_KEY = dg.AssetKey(["models", "topology_model"])
#: each test trains its own days (the window is 4 days: the table covers them all)
POOL_DAYS = ["2026-07-10", "2026-07-11", "2026-07-12"]
DAEMON_DAYS = ["2026-07-13", "2026-07-14"]
POSTGRES_DAYS = ["2026-07-15"]
WORKER_DAYS = ["2026-07-16", "2026-07-17"]


class Topology:
    """The running cluster, the deployment's client and the instance, for one module."""

    def __init__(self, cluster: Any, base: str) -> None:
        from zipline_dagster.lineage.deployment import Deployment

        self.cluster, self.base = cluster, base
        self.web = Deployment(cluster.web_url)
        self.instance = dg.DagsterInstance.get()
        self.defs = importlib.import_module("tests.cluster.topology_defs").defs

    def backfill(self, days: list[str], title: str) -> str:
        from zipline_dagster.lineage.backfill import plan_backfill

        plan = plan_backfill(self.defs, self.instance, MODEL_KEY, days)
        assert [(k, p) for k, p in plan.steps] == [(MODEL_KEY, days)], plan.describe()
        return self.web.launch(plan, title=title)

    def wait(self, backfill_id: str, timeout_s: float = 300) -> str:
        return self.web.wait(backfill_id, timeout_s=timeout_s, poll_s=1.0, log=lambda _: None)

    def runs(self, backfill_id: str) -> list[dg.DagsterRun]:
        return list(
            self.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        )

    def ray_jobs(self) -> list[Any]:
        from ray.job_submission import JobSubmissionClient

        address = self.cluster.env(secret=False)["RAY_ADDRESS"]
        return [j for j in JobSubmissionClient(address).list_jobs() if j.submission_id]

    def jobs_of(self, days: list[str]) -> list[Any]:
        """The Ray jobs that trained any of ``days`` (a range job's label is ``a_b``)."""
        out = []
        for job in self.ray_jobs():
            label = (job.metadata or {}).get("zipline.ds", "")
            first, _, last = label.partition("_")
            if any(first <= d <= (last or first) for d in days):
                out.append(job)
        return out

    def wait_for_job(self, days: list[str], timeout_s: float = 180) -> Any:
        """The first Ray job training one of ``days`` once it is running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [j for j in self.jobs_of(days) if str(j.status) == "RUNNING"]
            if running:
                return running[0]
            time.sleep(0.5)
        jobs = [(j.metadata or {}).get("zipline.ds") for j in self.ray_jobs()]
        runs = [(r.run_id[:8], r.status.value) for r in self.instance.get_runs(limit=10)]
        raise AssertionError(
            f"no Ray job trained {days} within {timeout_s}s; Ray jobs: {jobs}; latest runs: {runs}"
        )

    def assert_agreed(self, days: list[str]) -> None:
        """The planner finds every day fresh (Dagster's record and storage agree, through
        the ledger), each partition's manifest verifies, and no day was trained by two
        Ray jobs at once."""
        from zipline_dagster.lineage.backfill import plan_backfill
        from zipline_dagster.storage.artifacts import is_committed
        from zipline_dagster.storage.blobs import blob_store

        plan = plan_backfill(self.defs, self.instance, MODEL_KEY, days)
        assert plan.empty, plan.describe()
        model = importlib.import_module("tests.cluster.topology_defs").model
        for ds in days:
            from zipline_dagster.storage.paths import model_partition_uri

            uri = model_partition_uri(model, ds)
            assert is_committed(blob_store(uri), uri, checksums=True), uri
            assert max_overlap(self.jobs_of([ds])) <= 1, f"{ds} trained twice at once"


def max_overlap(jobs: list[Any]) -> int:
    """The most Ray jobs going at one moment, from their start and end times."""
    edges = sorted(
        itertools.chain.from_iterable(
            [(j.start_time, 1), ((j.end_time or time.time() * 1000), -1)] for j in jobs
        ),
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    from scripts.cluster import Cluster
    from zipline_dagster.training.archive import publish_trainer_archive

    if not sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        pytest.fail("no PostgreSQL server: `make test` installs it (scripts/system-deps)")
    # under the project, not /tmp/pytest-of-*: Postgres runs as its own user and must
    # reach its data folder
    folder = ROOT / ".zipline" / f"test-cluster-{os.getpid()}"
    base = (tmp_path_factory.mktemp("topology") / "artifacts").as_uri()
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="topology_model", base=base
    ).version
    workspace = folder.parent / f"{folder.name}-workspace.yaml"
    folder.parent.mkdir(parents=True, exist_ok=True)
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: tests.cluster.topology_defs\n"
        f"      working_directory: {ROOT}\n"
    )
    saved = dict(os.environ)
    os.environ.update(
        {
            "ZIPLINE_CLUSTER_DIR": str(folder),
            "ZIPLINE_CLUSTER_WORKSPACE": str(workspace),
            "ZIPLINE_TOPOLOGY": json.dumps({"version": version, "base": base, "steps": STEPS}),
        }
    )
    cluster = Cluster(folder)
    try:
        cluster.up()
        os.environ.update(cluster.env())  # this process is a client of the deployment
        warehouse = cluster.env()["ZIPLINE_WAREHOUSE"]
        write_table(warehouse, "ctr.training_v1", days_ending(WORKER_DAYS[-1], 12), rows=50)
        yield Topology(cluster, base)
    finally:
        cluster.down()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(folder, ignore_errors=True)
        workspace.unlink(missing_ok=True)


def test_trainings_share_the_pool_and_never_exceed_its_limit(topology: Topology) -> None:
    """Three backfills of one model partition each, at once: their runs start together,
    but no more than the pool's limit (2) of Ray training jobs are ever going at once."""
    from scripts.cluster import TRAINING_POOL_LIMIT

    ids = [topology.backfill([ds], f"pool {ds}") for ds in POOL_DAYS]
    assert [topology.wait(i) for i in ids] == ["COMPLETED_SUCCESS"] * 3
    jobs = topology.jobs_of(POOL_DAYS)
    assert len(jobs) == 3 and all(str(j.status) == "SUCCEEDED" for j in jobs)
    assert max_overlap(jobs) <= TRAINING_POOL_LIMIT
    # they competed: the three runs were all submitted before the first one ended (the
    # queue holds a run whose pool is full: `block_op_concurrency_limited_runs`)
    records = topology.instance.get_run_records(
        filters=dg.RunsFilter(run_ids=[r.run_id for i in ids for r in topology.runs(i)])
    )
    assert len(records) == 3
    created = max(r.create_timestamp.timestamp() for r in records)
    assert created < min(r.end_time or 0 for r in records)
    topology.assert_agreed(POOL_DAYS)


def test_a_killed_daemon_comes_back_and_the_backfill_completes(topology: Topology) -> None:
    """``kill -9`` of dagster-daemon while the backfill's training runs (its process: the
    run it launched goes on, as a deployment's runs outlive their daemon); started again,
    the backfill goes on from where it was: nothing trained twice, every day fresh."""
    backfill = topology.backfill(DAEMON_DAYS, "daemon killed")
    topology.wait_for_job(DAEMON_DAYS)
    topology.cluster.kill("dagster-daemon", group=False)
    time.sleep(3)
    topology.cluster.start("dagster-daemon")
    assert topology.wait(backfill) == "COMPLETED_SUCCESS"
    assert len(topology.jobs_of(DAEMON_DAYS)) == 1  # the range trained once, in one job
    topology.assert_agreed(DAEMON_DAYS)


def test_postgres_restarted_mid_run_leaves_dagster_and_storage_agreeing(
    topology: Topology,
) -> None:
    """Postgres is stopped and started again while a training's run waits on its Ray
    job: the run completes, or fails and is retried (the instance's run retries); either
    way the backfill completes and Dagster's record and storage agree."""
    backfill = topology.backfill(POSTGRES_DAYS, "postgres restarted")
    topology.wait_for_job(POSTGRES_DAYS)
    topology.cluster.stop("postgres")
    time.sleep(2)
    topology.cluster.start("postgres")
    assert topology.wait(backfill) == "COMPLETED_SUCCESS"
    topology.assert_agreed(POSTGRES_DAYS)


def test_a_killed_ray_worker_node_is_survived_by_a_retry(topology: Topology) -> None:
    """``kill -9`` of the process group of the Ray worker node running a model range's
    job: the job is lost, the run fails and the instance retries it; the retry trains on
    the surviving node, and every day ends committed and fresh, none half-promoted."""
    backfill = topology.backfill(WORKER_DAYS, "worker killed")
    job = topology.wait_for_job(WORKER_DAYS)
    victim = topology.cluster.worker_of(job.driver_node_id)
    topology.cluster.kill(victim)
    try:
        assert topology.wait(backfill, timeout_s=400) == "COMPLETED_SUCCESS"
        runs = topology.runs(backfill)
        model_runs = [r for r in runs if r.tags.get("dagster/parent_run_id")]
        assert model_runs, "the failed run was not retried"
        topology.assert_agreed(WORKER_DAYS)
    finally:
        topology.cluster.stop(victim)
        topology.cluster.start(victim)
