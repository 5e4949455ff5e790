"""The running topology as the tests see it: the deployment's client, its instance, its
Ray jobs, and the checks every fault ends with (``tests/cluster/conftest.py`` starts it)."""

from __future__ import annotations

import importlib
import itertools
import time
from typing import Any

import dagster as dg

MODEL_KEY = dg.AssetKey(["models", "topology_model"])
#: half-second steps per training: long enough for a fault to land mid-training
STEPS = 16
#: the last day any test trains (the table is written up to it)
LAST_DAY = "2026-07-20"


class Topology:
    """The running cluster, the deployment's client and the instance, for the tests of one package."""

    def __init__(self, cluster: Any) -> None:
        from zipline_dagster.lineage.deployment import Deployment

        self.cluster = cluster
        self.web = Deployment(cluster.web_url)
        self.instance = dg.DagsterInstance.get()
        # the deployment's code location, loaded here too (its environment is set)
        location = importlib.import_module("tests.cluster.topology_defs")
        self.defs, self.model = location.defs, location.model
        #: each backfill's planned partitions (the UI's are not known here)
        self.targets: dict[str, set[tuple[dg.AssetKey, str | None]]] = {}
        #: the status ``wait`` returned for each backfill
        self.ended: dict[str, str] = {}

    def backfill(self, days: list[str], title: str) -> str:
        from zipline_dagster.lineage.backfill import plan_backfill

        plan = plan_backfill(self.defs, self.instance, MODEL_KEY, days)
        assert [(k, p) for k, p in plan.steps] == [(MODEL_KEY, days)], plan.describe()
        backfill_id = self.web.launch(plan, title=title)
        self.targets[backfill_id] = {(MODEL_KEY, d) for d in days}
        return backfill_id

    def wait(self, backfill_id: str, timeout_s: float = 300) -> str:
        """As `zipline-dagster backfill --url --wait` waits (with the plan's targets): it
        may end before the daemon's next pass marks the backfill, which
        ``assert_daemon_agreed`` checks once the package's tests are done."""
        status = self.web.wait(
            backfill_id,
            timeout_s=timeout_s,
            poll_s=1.0,
            log=lambda _: None,
            targets=self.targets.get(backfill_id),
        )
        if backfill_id in self.targets:  # the UI's backfills end by the daemon's counts
            self.ended[backfill_id] = status
        return status

    def assert_daemon_agreed(self, timeout_s: float = 90) -> None:
        """Each backfill ``wait`` saw end from its targets ended so in Dagster too, as
        the daemon marked it."""
        deadline = time.monotonic() + timeout_s
        for backfill_id, seen in self.ended.items():
            while (marked := self.instance.get_backfill(backfill_id)).status.value == "REQUESTED":  # type: ignore[union-attr]
                assert time.monotonic() < deadline, f"backfill {backfill_id} still REQUESTED"
                time.sleep(1.0)
            assert marked.status.value == seen, (backfill_id, marked.status.value, seen)  # type: ignore[union-attr]

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

    def timeline(self, backfill_id: str, days: list[str]) -> str:
        """When each run of the backfill and each Ray job of ``days`` started and ended,
        in seconds from the first (shown with a failure: where a fault's time went)."""
        runs = self.instance.get_run_records(
            filters=dg.RunsFilter(run_ids=[r.run_id for r in self.runs(backfill_id)])
        )
        spans = [
            (
                f"run {r.dagster_run.run_id[:8]} {r.dagster_run.status.value}",
                r.start_time,
                r.end_time,
            )
            for r in runs
        ] + [
            (f"job {j.submission_id} {j.status}", j.start_time / 1000, (j.end_time or 0) / 1000)
            for j in self.jobs_of(days)
        ]
        t0 = min((s for _, s, _ in spans if s), default=0)
        return "\n".join(
            f"{what}: {(s or t0) - t0:.0f}s..{(e - t0) if e else float('nan'):.0f}s"
            for what, s, e in sorted(spans, key=lambda x: x[1] or 0)
        )

    def assert_agreed(self, days: list[str]) -> None:
        """The planner finds every day fresh (Dagster's record and storage agree, through
        the ledger), each partition's manifest verifies, and no day was trained by two
        Ray jobs at once."""
        from zipline_dagster.lineage.backfill import plan_backfill
        from zipline_dagster.storage.blobs import blob_store
        from zipline_dagster.storage.manifests import model_partition
        from zipline_dagster.storage.paths import model_partition_uri

        plan = plan_backfill(self.defs, self.instance, MODEL_KEY, days)
        assert plan.empty, plan.describe()
        for ds in days:
            uri = model_partition_uri(self.model, ds)
            assert model_partition(blob_store(uri), uri, checksums=True).committed, uri
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
