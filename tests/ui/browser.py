"""Debian's chromium driven by Playwright, as the UI tests open it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
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


def materialize_champion(page: Any, web_url: str, model: str, screenshot: str) -> str:
    """Materialize ``model``'s champion from its asset page and wait until the page shows
    it moved (to the newest partition passing every gate); its ``artifact_uri`` row."""
    url = f"{web_url}/assets/champions/{model}"
    page.goto(url)
    launch = page.get_by_role("button", name="Materialize").first
    launch.wait_for(timeout=60_000)
    launch.click()
    deadline = time.monotonic() + 180
    while not page.get_by_text("newest partition passing every gate").count():
        assert time.monotonic() < deadline, "the champion asset did not materialize"
        page.wait_for_timeout(1500)
        page.goto(url)
        page.wait_for_timeout(1000)
    page.screenshot(path=str(SCREENSHOTS / screenshot), full_page=True)
    return str(page.locator("tr", has_text="artifact_uri").first.inner_text())
