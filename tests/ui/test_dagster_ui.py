"""The Dagster UI in a real browser (Debian's chromium driven by Playwright), against
Dagster's webserver and daemon (the two `dagster dev` runs) on loopback with the demo
code location: launch one model partition from
the UI, wait for it, and check the metadata a user looks at is shown, the partition's
blocking checks with their numbers, and the champion asset moving to it."""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from tests.cleanup import register, unregister
from tests.conftest import BIN, ROOT, free_port, wait_http
from tests.ui.browser import (
    SCREENSHOTS,
    browser_page,
    launch_partitions,
    materialize_champion,
    materialized,
    reload_until,
    require_chromium,
    run_ended,
)
from zipline_dagster.lineage.deployment import Deployment

pytestmark = [pytest.mark.ui, pytest.mark.ray, pytest.mark.spark]
#: Recent days, as a team's daily model has: Dagster's "Plots" by partition view draws
#: an asset's newest 120 partitions only (a day months back plots nothing there)
_TODAY = dt.datetime.now(dt.UTC).date()
DS = (_TODAY - dt.timedelta(days=2)).isoformat()
DAY_BEFORE = (_TODAY - dt.timedelta(days=3)).isoformat()
FIRST = (_TODAY - dt.timedelta(days=6)).isoformat()
#: the day after DS: scored by it
NEXT = (_TODAY - dt.timedelta(days=1)).isoformat()

PREPARE = """
import sys
import dagster as dg
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.lineage.backfill import model_partitions, plan_backfill
from zipline_dagster.lineage.internals import execute_plan_in_process
from zipline_dagster.defs import defs
from zipline_dagster.defs.listing_ctr import listing_ctr_model as m
from zipline_dagster.defs.listing_price import listing_price_model as p
for model in (m, p):  # automation may train either once the training table exists
    publish_trainer_archive(f"trainers/{model.name}", model_name=model.name, base=model.model_artifact_base_uri)
key = dg.AssetKey(["ctr", "training_v1"])
instance = dg.DagsterInstance.get()
plan = plan_backfill(defs, instance, key, model_partitions(defs, key, sys.argv[1], sys.argv[2]))
execute_plan_in_process(defs, instance, plan, log=lambda m: None)
"""


@pytest.fixture(scope="module")
def dagster_dev(
    ray_head: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Dagster's webserver and daemon with the demo code location; its upstream tables
    already built."""
    require_chromium()
    tmp = tmp_path_factory.mktemp("ui")
    home = tmp / "dagster_home"
    home.mkdir()
    # its run queue read every second (Dagster's default: every 5 s)
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nrun_coordinator:\n  module: dagster._core.run_coordinator\n"
        "  class: QueuedRunCoordinator\n  config:\n    dequeue_interval_seconds: 1\n"
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ZIPLINE_HOME": str(tmp / "zipline"),
        "RAY_ADDRESS": ray_head.dashboard_url,
        "SPARK_MASTER": "local[2]",
    }
    subprocess.run(
        [sys.executable, "-c", PREPARE, FIRST, NEXT],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    port = free_port()
    log = open(tmp / "dagster_dev.log", "wb")  # noqa: SIM115
    # the webserver and the daemon `dagster dev` runs, in one process group; the daemon's
    # backfill pass every 5 s as the topology's (Dagster's fixed 30 s otherwise: a
    # backfill's test would spend a minute on it)
    webserver = [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    daemon = "from zipline_dagster.lineage.internals import run_daemon; run_daemon(['run', '-w', 'workspace.yaml'], interval_s=5)"  # fmt: skip
    both = f"{shlex.join(webserver)} & exec {shlex.join([str(BIN / 'python'), '-c', daemon])}"
    proc = subprocess.Popen(
        ["bash", "-c", both],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    register(proc.pid, group=True, what="dagster webserver and daemon")
    try:
        wait_http(f"http://127.0.0.1:{port}/server_info", timeout=120)
        yield {
            "url": f"http://127.0.0.1:{port}",
            "warehouse": f"file://{tmp / 'zipline' / 'warehouse'}",
            "env": env,  # type: ignore[dict-item]
            "log": tmp / "dagster_dev.log",
        }
    finally:
        # a few seconds' grace, then the group is killed: a disposable instance, and
        # the daemon takes over 20 s to wind down its threads
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        unregister(proc.pid)


def test_launch_partition_from_ui_and_see_metadata(dagster_dev: dict[str, Any]) -> None:
    asset_url = f"{dagster_dev['url']}/assets/models/listing_ctr_model"
    home = dagster_dev["env"]["DAGSTER_HOME"]
    with browser_page() as page, dg.DagsterInstance.from_config(home) as instance:
        launch_partitions(page, asset_url, DS, "Launch 1 run")
        reload_until(
            page,
            asset_url,
            "holdout/auc",
            timeout_s=300,
            what="the launched run did not materialize the model",
            log=dagster_dev["log"],
            ready=materialized(instance, dg.AssetKey(["models", "listing_ctr_model"]), DS),
        )
        page.screenshot(path=str(SCREENSHOTS / "model_metadata.png"), full_page=True)

        body = page.locator("body").inner_text()
        assert DS in body  # the latest materialization is the launched partition
        artifact = f"{dagster_dev['warehouse']}/models/listing_ctr_model/"
        assert artifact in body
        auc_row = page.locator("tr", has_text="holdout/auc").first.inner_text()
        auc = float(auc_row.split()[-1])
        assert 0.6 < auc < 1.0

        page.get_by_placeholder("Filter metadata keys").fill("pr_curve")
        page.get_by_text("[Show Markdown]").click()
        image = page.locator("img[src^='data:image/png']")
        image.wait_for(timeout=10_000)
        assert image.evaluate("img => img.naturalWidth") > 100  # a real picture decoded
        page.screenshot(path=str(SCREENSHOTS / "model_pr_curve.png"))

        # Its numeric metadata plotted across partitions (the metadata's Plots view, by
        # Partitions: the newest 120 partition keys), its cost among them.
        page.goto(asset_url)
        page.get_by_role("button", name="Plots").first.click()
        page.get_by_role("button", name="Partitions").first.wait_for(timeout=30_000)
        for plotted in ("holdout/auc", "cost/cpu_s", "cost/peak_mem_mb", "cost/wall_s"):
            page.get_by_text(plotted, exact=True).first.wait_for(timeout=30_000)
        assert not page.get_by_text("Asset plots are automatically generated").count()
        page.screenshot(path=str(SCREENSHOTS / "model_plots_by_partition.png"), full_page=True)

        # The run ran the partition's blocking checks; the Checks tab shows each one
        # with the numbers that decided it.
        page.goto(f"{asset_url}?view=checks")
        page.get_by_text("rollout_thresholds").first.wait_for(timeout=60_000)
        body = page.locator("body").inner_text()
        for check in (
            "rollout_thresholds",
            "no_regression_vs_champion",
            "report_complete",
            "manifest_verifies",
        ):
            assert check in body
        page.get_by_text("rollout_thresholds").first.click()
        verdict = f"holdout_auc={auc:.4f} (holdout_auc >= 0.65)"
        page.get_by_text(verdict).first.wait_for(timeout=30_000)
        page.screenshot(path=str(SCREENSHOTS / "model_checks.png"), full_page=True)
        body = page.locator("body").inner_text()
        assert "This is a blocking asset check" in body and "Passed" in body
        assert DS in body

        # The champion asset, materialized from the UI, moves to that partition; the run
        # the click launched (not the champion sensor's) ends in success.
        ds_row, clicked = materialize_champion(
            page,
            dagster_dev["url"],
            "listing_ctr_model",
            DS,
            "champion.png",
            instance,
            dagster_dev["log"],
        )
        assert "/models/listing_ctr_model/" in ds_row and ds_row.rstrip().endswith(DS)
        assert run_ended(instance, clicked) == "SUCCESS"

        # The day after, scored from the UI: its drift and cost plotted by partition.
        scores_url = f"{dagster_dev['url']}/assets/ctr/listing_ctr_model_scores"
        launch_partitions(page, scores_url, NEXT, "Launch 1 run")
        reload_until(
            page,
            scores_url,
            "drift/psi_predictions",
            timeout_s=300,
            what="the launched run did not score the day",
            log=dagster_dev["log"],
            ready=materialized(instance, dg.AssetKey(["ctr", "listing_ctr_model_scores"]), NEXT),
        )
        page.get_by_role("button", name="Plots").first.click()
        for plotted in ("drift/psi_predictions", "drift/max_feature_psi", "cost/cpu_s"):
            page.get_by_text(plotted, exact=True).first.wait_for(timeout=30_000)
        assert not page.get_by_text("Asset plots are automatically generated").count()
        page.screenshot(path=str(SCREENSHOTS / "scores_plots_by_partition.png"), full_page=True)


def test_a_backfill_launched_and_followed_through_the_webserver(
    dagster_dev: dict[str, Any],
) -> None:
    """``zipline-dagster backfill --url``, as against a deployment: the plan goes to the
    webserver's GraphQL API as one asset backfill (the model partition, then its
    champion), the deployment's own daemon runs it, and the command follows it to its end
    and names the champion. Run again, the partition is fresh: nothing is launched."""
    command = [
        str(BIN / "zipline-dagster"),
        *("backfill", "listing_ctr_model", "--start-ds", DAY_BEFORE, "--end-ds", DAY_BEFORE),
        *("--url", dagster_dev["url"], "--wait"),
    ]
    run = subprocess.run(
        command, cwd=ROOT, env=dagster_dev["env"], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"models/listing_ctr_model: {DAY_BEFORE} (missing)" in run.stderr
    assert re.search(r"^backfill_id=\w+$", run.stdout, re.M), run.stdout
    assert "status=COMPLETED_SUCCESS" in run.stdout
    # the progress the deployment reported: the model's run, then the champion's
    assert re.search(r"COMPLETED_SUCCESS: 2 runs 2 success", run.stderr), run.stderr
    assert re.search(rf"^champion=\w{{12}}/({DAY_BEFORE}|{DS}) \(", run.stdout, re.M), run.stdout
    # the runs are read page by page (a backfill can have more than one page of runs)
    backfill_id = run.stdout.split("backfill_id=", 1)[1].split()[0]
    paged = Deployment(dagster_dev["url"], page=1)
    ids = [r["runId"] for r in paged.runs(backfill_id, "status")]
    assert len(set(ids)) == 2
    assert ids == [r["runId"] for r in Deployment(dagster_dev["url"]).runs(backfill_id, "status")]
    assert paged.status(backfill_id) == ("COMPLETED_SUCCESS", ["SUCCESS", "SUCCESS"])

    again = subprocess.run(
        command, cwd=ROOT, env=dagster_dev["env"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr
    assert "backfill_id=none (every partition is fresh)" in again.stdout


def test_a_table_partition_shows_its_columns_row_count_and_snapshot(
    dagster_dev: dict[str, Any],
) -> None:
    """The training table's page: the Iceberg table it is (``dagster/table_name``), its
    columns (``dagster/column_schema``), the row count and the snapshot that wrote the
    latest day, as the catalog holds them."""
    from zipline_dagster.storage.resources import WarehouseResource

    held = WarehouseResource(uri=dagster_dev["warehouse"]).tables().days("ctr.training_v1")
    snapshots = {str(d.snapshot_id) for d in held.values()}
    url = f"{dagster_dev['url']}/assets/ctr/training_v1"
    with browser_page() as page:
        reload_until(page, url, "snapshot_id", timeout_s=120, what="no table metadata shown")
        page.screenshot(path=str(SCREENSHOTS / "table_metadata.png"), full_page=True)
        body = page.locator("body").inner_text()
        assert any(s in body for s in snapshots), "no snapshot of the table is shown"
        assert "ctr.training_v1" in body  # dagster/table_name
        assert "price_log" in body and "label" in body  # its columns
        assert any(f"{d.rows:,}" in body or str(d.rows) in body for d in held.values())
