"""Debian's chromium driven by Playwright, as the UI tests open it."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "test-artifacts" / "ui"


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (`make test` does, with "
            "scripts/system-deps)"
        )


@contextlib.contextmanager
def browser_page() -> Iterator[Any]:
    """A page of a headless chromium (closed when the block ends), past Dagster's
    first-visit prompt once a page has loaded (``skip_prompt``)."""
    from playwright.sync_api import sync_playwright

    require_chromium()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def skip_prompt(page: Any) -> None:
    """Dismiss the community prompt Dagster shows on a first visit, when it is there."""
    page.wait_for_timeout(2000)
    if page.get_by_role("button", name="Skip").count():
        page.get_by_role("button", name="Skip").click()


def launch_partitions(page: Any, asset_url: str, selection: str, button: Any) -> None:
    """On the asset's page: Materialize…, the partitions ``selection`` typed in (``DS``
    or ``[A...B]``), launched with ``button`` (its name, or a pattern)."""
    page.goto(asset_url)
    materialize = page.get_by_role("button", name="Materialize…")
    materialize.wait_for(timeout=60_000)
    skip_prompt(page)
    materialize.click()
    page.get_by_text("Show all partitions").click()
    partitions = page.locator("[role=dialog] input").first
    partitions.fill(selection)
    partitions.press("Enter")
    page.get_by_role("button", name=button).click()


def reload_until(
    page: Any,
    url: str,
    text: str | re.Pattern[str],
    *,
    timeout_s: float,
    what: str,
    log: Path | None = None,
    ready: Callable[[], bool] | None = None,
) -> None:
    """Reload ``url`` until the page shows ``text``; fails naming ``what`` after
    ``timeout_s`` (with the last lines of the webserver and daemon's ``log``, when
    given, and a screenshot ``timeout.png``).

    With ``ready`` (a look at the instance: the run ended, the partition materialized),
    the page is reloaded only once it holds, and every ``FALLBACK_S`` meanwhile: each load
    of a Dagster page costs the browser and the webserver a CPU-second or more (the
    asset's partitions, its events, its plots), and a run takes a minute on a busy machine.
    """
    deadline = time.monotonic() + timeout_s
    loaded = time.monotonic()
    while not page.get_by_text(text).count():
        if time.monotonic() >= deadline:
            page.screenshot(path=str(SCREENSHOTS / "timeout.png"), full_page=True)
            tail = log.read_text(errors="replace").splitlines()[-60:] if log else []
            raise AssertionError("\n".join([what, *tail]))
        if ready is not None and time.monotonic() - loaded < FALLBACK_S and not ready():
            time.sleep(1)
            continue
        page.wait_for_timeout(1500)
        page.goto(url)
        page.wait_for_timeout(1000)
        loaded = time.monotonic()


#: How long ``reload_until`` waits at most for its ``ready`` between two loads of the page.
FALLBACK_S = 20


def materialized(instance: Any, key: Any, partition: str) -> Callable[[], bool]:
    """A ``ready`` for ``reload_until``: whether ``instance`` holds a materialization of
    ``key``'s ``partition``."""
    return lambda: partition in instance.get_materialized_partitions(key)


def materialize_champion(
    page: Any,
    web_url: str,
    model: str,
    ds: str,
    screenshot: str,
    instance: Any,
    log: Path | None = None,
) -> tuple[str, str]:
    """Materialize ``model``'s champion from its asset page and wait until the page shows
    it at ``ds``: moved there (the newest partition passing every gate), or staying there
    when the champion sensor moved it first (the daemon evaluates the champion once a
    model partition materialized: a race with the click). Returns its ``artifact_uri``
    row and the ID of the run the click launched.

    The page is reloaded only once the click's run exists in ``instance``: a reload
    while the UI's launch request is still on its way cancels it (under load the
    webserver answers slowly), and the sensor's run would then stand in for the click's.
    """
    url = f"{web_url}/assets/champions/{model}"
    before = set(_hand_runs(instance, model))
    page.goto(url)
    launch = page.get_by_role("button", name="Materialize").first
    launch.wait_for(timeout=60_000)
    launch.click()
    deadline = time.monotonic() + 60
    while not (clicked := [r for r in _hand_runs(instance, model) if r not in before]):
        if time.monotonic() >= deadline:
            page.screenshot(path=str(SCREENSHOTS / "timeout.png"), full_page=True)
            raise AssertionError(f"the Materialize click launched no run of {model}'s champion")
        page.wait_for_timeout(500)
    reload_until(
        page,
        url,
        re.compile(
            rf"newest partition passing every gate|stays at \w+/{re.escape(ds)}: "
            "no newer trained partition"
        ),
        timeout_s=180,
        what="the champion asset did not materialize",
        log=log,
        ready=lambda: bool(instance.get_run_by_id(clicked[0]).is_finished),
    )
    page.screenshot(path=str(SCREENSHOTS / screenshot), full_page=True)
    return str(page.locator("tr", has_text="artifact_uri").first.inner_text()), clicked[0]


def _hand_runs(instance: Any, model: str) -> list[str]:
    """IDs of ``model``'s champion runs launched by hand (no sensor's, no backfill's)."""
    import dagster as dg

    key = dg.AssetKey(["champions", model])
    return [
        r.run_id
        for r in instance.get_runs()
        if key in (r.asset_selection or ())
        and not {"dagster/sensor_name", "dagster/backfill"} & set(r.tags)
    ]


def run_ended(instance: Any, run_id: str, timeout_s: float = 180) -> str:
    """The status of run ``run_id`` once it ended (or as it is after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = instance.get_run_by_id(run_id)
        if run.is_finished or time.monotonic() > deadline:
            return str(run.status.value)
        time.sleep(1)
