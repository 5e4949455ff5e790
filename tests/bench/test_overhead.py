"""One model partition through Dagster + a Ray Job on a warm cluster, against the same
trainer run by hand on the same data; and the platform's own share of that partition:
the step's time before Ray's job starts plus after it ends, from Dagster's step events
and Ray's own job timestamps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.bench.direct import direct_run
from tests.bench.record import Case, Series, record, repeat
from tests.conftest import TRAINERS
from tests.helpers import days_ending, write_table
from tests.support.training import DS, TABLE, make_model, resources
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.request import (
    build_training_request,
)
from zipline_dagster.jobs.resources import RayJobsResource
from zipline_dagster.training.assets import build_model_asset

pytestmark = [pytest.mark.bench, pytest.mark.ray]


def platform_share(instance: dg.DagsterInstance, run_id: str, info: Any) -> tuple[float, float]:
    """(before the job started, after it ended) in seconds: the step's start and end from
    Dagster's event log, the job's from Ray (``start_time``/``end_time``, ms)."""
    stamps = {}
    for entry in instance.all_logs(run_id):
        ev = entry.dagster_event
        if ev is not None and ev.event_type_value in ("STEP_START", "STEP_SUCCESS"):
            stamps[ev.event_type_value] = entry.timestamp
    before = info.start_time / 1000.0 - stamps["STEP_START"]
    after = stamps["STEP_SUCCESS"] - info.end_time / 1000.0
    return before, after


def test_model_partition_overhead(ray_head: Any, tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    base = (tmp_path / "wh").as_uri()
    write_table(base, TABLE, days_ending(DS, 4), rows=2_000)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=base
    ).version
    job_configs = {
        "label-column": "label",
        "eval-days": "1",
        "features": "price_log,inventory_count",
        "num-rounds": "20",
    }
    model = make_model(version, base, job_configs=job_configs)
    default_poll = RayJobsResource.model_fields["poll_max_s"].default
    res = resources(ray_head.dashboard_url, base, poll_max_s=default_poll)
    asset = build_model_asset(model=model)
    client = JobSubmissionClient(ray_head.dashboard_url)
    shares: list[tuple[float, float]] = []
    jobs: list[float] = []

    def one() -> float:
        instance = dg.DagsterInstance.ephemeral()
        t0 = time.perf_counter()
        result = dg.materialize([asset], partition_key=DS, resources=res, instance=instance)
        wall = time.perf_counter() - t0
        assert result.success
        mat = result.get_asset_materialization_events()[0].event_specific_data.materialization  # type: ignore[union-attr]
        info = client.get_job_info(str(mat.metadata["ray_job_id"].value))
        shares.append(platform_share(instance, result.run_id, info))
        jobs.append((info.end_time - info.start_time) / 1000.0)
        return wall

    # One run first, not measured: the case is of a warm cluster whether the cases before
    # it ran or not (run alone, its first job builds the pip env, cached per requirement
    # set: 18 s, and the platform's first Ray client call takes a second).
    one()
    shares.clear()
    jobs.clear()
    platform = repeat(one)
    argv = build_training_request(model, DS, warehouse=base).argv
    argv = [
        a if not a.startswith("--model-dir=") else f"--model-dir={tmp_path / 'direct'}"
        for a in argv
    ]
    direct = repeat(lambda: direct_run(argv))

    measured = Series("Dagster + Ray Job", platform)
    baseline = Series("trainer by hand", direct)
    record(
        Case(
            name="one model partition (2k rows/day x 4 days, 20 rounds), warm cluster",
            baseline=baseline,
            measured=measured,
            goal="informational",
            value=measured.median - baseline.median,
            value_text=f"+{measured.median - baseline.median:.2f} s over the trainer by hand",
            met=None,
            notes=[
                "Ray's own job (submit to end): "
                + Series("job", jobs).spread()
                + "; the difference to the trainer by hand is mostly Ray's job start "
                "(driver process, runtime env) which the platform does not control."
            ],
        )
    )
    own = Series("before submit + after end", [b + a for b, a in shares])
    record(
        Case(
            name="platform's own share of a model partition (default settings)",
            baseline=Series("Ray's job, submit to end", jobs),
            measured=own,
            goal="<= 0.5 s",
            value=own.median,
            value_text=f"median {own.median:.2f} s",
            met=own.median <= 0.5,
            notes=[
                "before the job started: "
                + Series("before", [b for b, _ in shares]).spread()
                + "; after it ended: "
                + Series("after", [a for _, a in shares]).spread(),
                "The step learns the job is ending from the marker file the archive's "
                "driver writes just before it exits (watched on storage; file:// here) or "
                "from its last log line, then polls status every 50 ms until Ray reports "
                "the end; otherwise polls back off to one every 2 s.",
            ],
        )
    )
