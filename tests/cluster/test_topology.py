"""Faults on the production topology (issue 39): ``scripts/cluster.py`` starts Postgres,
S3, a Ray head with two worker nodes and Dagster's daemon and webserver as their own
processes (its Spark master and worker are left out: no test here runs a Spark step);
the code location ``tests.cluster.topology_defs`` is deployed to them, and work goes in
as backfills through the webserver, which the daemon runs. Then real processes are
killed or restarted under it: the daemon, Postgres, a Ray worker node, the Ray head.

Every fault ends the same way: the backfill completes, the planner finds every partition
fresh (what Dagster recorded and what storage holds agree), every model partition's
manifest verifies, and no partition was ever trained by two Ray jobs at once.

One cluster serves the package (``tests/cluster/conftest.py``).
"""

from __future__ import annotations

import time

import dagster as dg
import pytest

from tests.cluster.topology import MODEL_KEY, Topology, max_overlap

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.cluster]

#: each test trains its own days (the window is 4 days: the table covers them all)
POOL_DAYS = ["2026-07-10", "2026-07-11", "2026-07-12"]
DAEMON_DAYS = ["2026-07-13", "2026-07-14"]
POSTGRES_DAYS = ["2026-07-15"]
WORKER_DAYS = ["2026-07-16", "2026-07-17"]
HEAD_DAYS = ["2026-07-18", "2026-07-19"]


def test_trainings_share_the_pool_and_never_exceed_its_limit(topology: Topology) -> None:
    """Three backfills of one model partition each, at once: their runs compete, but no
    more than the pool's limit (2) of Ray training jobs are ever going at once."""
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
    """``kill -9`` of the Ray worker node running a model range's job, every process of
    it as a pod's death would end them (its process group alone left the job's driver,
    in a session of its own, training to the end: its results on storage then stood):
    the job is lost, the run fails and the instance retries it; the retry trains on the
    surviving node, and every day ends committed and fresh, none half-promoted."""
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
        print(topology.timeline(backfill, WORKER_DAYS))
        topology.cluster.stop(victim)
        topology.cluster.start(victim)


def test_a_lost_ray_head_comes_back_whole_and_the_backfill_finishes(topology: Topology) -> None:
    """``kill -9`` of the Ray head (every process of it) while a model range's job runs,
    then ``start ray-head`` as a rescheduled head pod: its worker nodes, which outlived it
    on the dead head's GCS, come back with it (the cluster is whole again: three nodes).
    The run meets a head that no longer knows its job and fails (or its retry trains);
    the backfill, run again where it did not finish, completes, and what was committed
    before it is not trained again."""
    from zipline_dagster.lineage.backfill import plan_backfill
    from zipline_dagster.storage.blobs import blob_store
    from zipline_dagster.storage.manifests import manifest_attempt
    from zipline_dagster.storage.paths import model_partition_uri

    backfill = topology.backfill(HEAD_DAYS, "ray head lost")
    topology.wait_for_job(HEAD_DAYS)
    topology.cluster.kill("ray-head")
    time.sleep(2)
    topology.cluster.start("ray-head")
    assert len(topology.cluster.ray_nodes()) == 3, topology.cluster.ray_nodes()
    assert {"ray-worker-1", "ray-worker-2"} <= set(topology.cluster.running())
    first = topology.wait(backfill, timeout_s=400)
    uris = {ds: model_partition_uri(topology.model, ds) for ds in HEAD_DAYS}
    committed = {ds: manifest_attempt(blob_store(u), u) for ds, u in uris.items()}
    if first != "COMPLETED_SUCCESS":
        # run again: the planner plans only the days storage does not hold
        missing = [ds for ds, attempt in committed.items() if attempt is None]
        plan = plan_backfill(topology.defs, topology.instance, MODEL_KEY, HEAD_DAYS)
        assert [(k, p) for k, p in plan.steps] == [(MODEL_KEY, missing)], plan.describe()
        again = topology.web.launch(plan, title="ray head lost, again")
        topology.targets[again] = {(MODEL_KEY, d) for d in missing}
        assert topology.wait(again) == "COMPLETED_SUCCESS"
    topology.assert_agreed(HEAD_DAYS)
    for ds, attempt in committed.items():  # what was committed stands, not trained again
        if attempt is not None:
            assert manifest_attempt(blob_store(uris[ds]), uris[ds]) == attempt, ds
