"""The Dagster UI served by the topology's own webserver (issue 39), in a real browser:
a user selects 3 model partitions and launches them as a backfill, the deployment's daemon
runs it, the UI shows the partitions materialized with their blocking checks passed, and
the champion, materialized from the UI, moves to the newest of them."""

from __future__ import annotations

import re
import time

import dagster as dg
import pytest

from tests.cluster.topology import MODEL_KEY, Topology
from tests.ui.browser import (
    SCREENSHOTS,
    browser_page,
    launch_partitions,
    materialize_champion,
    run_ended,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.cluster, pytest.mark.ui]

UI_DAYS = ["2026-07-18", "2026-07-19", "2026-07-20"]


def test_a_backfill_of_three_partitions_launched_from_the_ui(topology: Topology) -> None:
    before = {b.backfill_id for b in topology.instance.get_backfills()}
    asset_url = f"{topology.cluster.web_url}/assets/{MODEL_KEY.to_user_string()}"
    with browser_page() as page:
        launch_partitions(
            page,
            asset_url,
            f"[{UI_DAYS[0]}...{UI_DAYS[-1]}]",
            re.compile(r"^Launch (backfill|3 runs)"),
        )

        # the daemon runs the backfill the UI submitted
        deadline = time.monotonic() + 300
        while not (
            new := [b for b in topology.instance.get_backfills() if b.backfill_id not in before]
        ):
            assert time.monotonic() < deadline, "the UI launched no backfill"
            time.sleep(1)
        (backfill,) = new
        assert topology.wait(backfill.backfill_id) == "COMPLETED_SUCCESS"
        done = topology.instance.get_materialized_partitions(MODEL_KEY)
        assert set(UI_DAYS) <= done
        topology.assert_agreed(UI_DAYS)

        # the UI shows the backfill complete, and the newest partition's checks passed
        page.goto(f"{topology.cluster.web_url}/runs/b/{backfill.backfill_id}")
        page.get_by_text("Completed", exact=False).first.wait_for(timeout=60_000)
        page.screenshot(path=str(SCREENSHOTS / "topology_backfill.png"), full_page=True)
        page.goto(f"{asset_url}?view=checks")
        page.get_by_text("report_complete").first.wait_for(timeout=60_000)
        body = page.locator("body").inner_text()
        assert "manifest_verifies" in body and "Passed" in body
        page.screenshot(path=str(SCREENSHOTS / "topology_checks.png"), full_page=True)

        # the champion, materialized from the UI, moves to the newest passing partition
        row, clicked = materialize_champion(
            page,
            topology.cluster.web_url,
            "topology_model",
            UI_DAYS[-1],
            "topology_champion.png",
            topology.instance,
        )
        assert "/models/topology_model/" in row and row.rstrip().endswith(UI_DAYS[-1])
        assert run_ended(topology.instance, clicked) == "SUCCESS"
    champion = topology.instance.get_latest_materialization_event(
        dg.AssetKey(["champions", "topology_model"])
    )
    assert champion is not None
