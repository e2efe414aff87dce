"""The UI in a real browser: Debian's Chromium, driven by Playwright, against `batch-assets ui` (dg dev).

A person's path: open customer_status, click Materialize (and confirm the assets the sweep also writes), and
the run ends SUCCESS, seen on its run page and in the database. The same test then takes the README's
screenshots of the lineage, the asset page (plots and checks) and the Automation page, each once the page has
its data (no loading spinner). They go to $BATCH_ASSETS_SCREENSHOTS when set (the README's command writes
docs/screenshots), else to the test's temporary directory.

Skips when /usr/bin/chromium or the playwright package is missing; CI installs both (.ci/run, the dev extra).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest
import sqlalchemy as sa
from helpers import wait_for
from ui_server import REPO, UiServer

from batch_assets.cli.ui import still_running
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.seed import seed_customers

pytestmark = [pytest.mark.dagster, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS_VAR = "BATCH_ASSETS_SCREENSHOTS"
ROWS = 300
RUN_TIMEOUT_S = 300.0
"""A Materialize run on a busy 2-core box: a run worker and one process per step, each loading the code location."""
PAGE_TIMEOUT_MS = 60_000

RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"
GROUPS_QUERY = "{ assetNodes { assetKey { path } groupName } }"
AUTOMATION_QUERY = """{ repositoryOrError(repositorySelector: {repositoryLocationName: "batch_assets",
  repositoryName: "__repository__"}) { ... on Repository { schedules { name } sensors { name } } } }"""


def _graphql(server: UiServer, query: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/graphql", json={"query": query}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body
    return dict(body["data"])


def _runs(server: UiServer) -> list[dict[str, Any]]:
    return list(_graphql(server, RUNS_QUERY)["runsOrError"]["results"])


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium (Debian's) with a fresh profile; its processes are killed at the end if still up."""
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium chromium-driver)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1100},
        )
        # The Playwright driver and Chromium's processes (not what other fixtures started before).
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        try:
            context.set_default_timeout(PAGE_TIMEOUT_MS)
            yield context
        finally:
            try:
                context.close()
            finally:
                for process in still_running(started):
                    process.kill()


def _until_loaded(page: Any) -> None:
    """Poll (with a deadline) until no "Loading" placeholder is left on the page."""
    wait_for(lambda: "Loading" not in page.inner_text("body"), timeout=PAGE_TIMEOUT_MS / 1000,
             what="the page's data", interval=0.3)


def _materialize_in_the_browser(page: Any, server: UiServer) -> str:
    """Open customer_status, click Materialize, confirm the sweep's other assets; the id of the launched run."""
    page.goto(f"{server.url}/assets/customer_status")
    page.locator("button", has_text="Materialize").first.click()
    confirm = page.get_by_role("button", name="Confirm")

    def launched() -> list[dict[str, Any]]:
        # The sweep also writes review_triggers and outbox_events: the UI asks to confirm those first.
        if confirm.is_visible():
            confirm.click()
        return [run for run in _runs(server)
                if {"key": "dagster/from_ui", "value": "true"} in run["tags"]]

    runs = wait_for(launched, timeout=60, what="the run that Materialize launched", interval=0.5)
    assert len(runs) == 1, runs
    return str(runs[0]["runId"])


def _shoot(page: Any, directory: Path, name: str) -> Path:
    path = directory / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path


def _lineage(page: Any, server: UiServer, directory: Path) -> None:
    nodes = _graphql(server, GROUPS_QUERY)["assetNodes"]
    groups = sorted({node["groupName"] for node in nodes})
    expanded = ",".join(f"global@global:{group}" for group in groups)
    page.set_viewport_size({"width": 1600, "height": 1200})
    page.goto(f"{server.url}/asset-groups?expanded={quote(expanded)}")
    for node in nodes:
        page.get_by_text(node["assetKey"]["path"][-1], exact=True).first.wait_for()
    _until_loaded(page)
    # Hide the asset list (the second panel button; the first hides the navigation), then center the graph.
    page.locator('button:has([aria-label="panel_show_right"])').last.click()
    page.mouse.move(1400, 600)
    page.mouse.down()
    page.mouse.move(1500, 660, steps=10)
    page.mouse.up()
    _shoot(page, directory, "lineage.png")


def _asset_page(page: Any, server: UiServer, directory: Path) -> None:
    page.set_viewport_size({"width": 1600, "height": 1400})
    page.goto(f"{server.url}/assets/customer_status")
    page.get_by_role("button", name="Plots").first.wait_for()
    wait_for(lambda: "Never materialized" not in page.inner_text("body"), timeout=PAGE_TIMEOUT_MS / 1000,
             what="the materialization on the asset page", interval=0.3)
    page.get_by_role("button", name="Plots").first.click()
    for metric in ("active_customers", "changed", "duration_s"):
        page.get_by_text(metric, exact=True).first.wait_for()
    _until_loaded(page)
    _shoot(page, directory, "customer_status_plots.png")

    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(f"{server.url}/assets/customer_status?view=checks")
    page.get_by_text("no_overdue_active_customers").first.wait_for()
    page.get_by_text("Latest execution").first.wait_for()
    page.get_by_text("Passed", exact=True).or_(page.get_by_text("Failed", exact=True)).first.wait_for()
    _until_loaded(page)
    _shoot(page, directory, "customer_status_checks.png")


def _automation(page: Any, server: UiServer, directory: Path) -> None:
    repository = _graphql(server, AUTOMATION_QUERY)["repositoryOrError"]
    names = [item["name"] for item in (*repository["schedules"], *repository["sensors"])]
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(f"{server.url}/automation")
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for()
    # Loaded: "select all", then a row checkbox and an on/off switch for each schedule and sensor.
    checkboxes = page.locator('input[type="checkbox"]')
    wait_for(lambda: checkboxes.count() == 1 + 2 * len(names), timeout=PAGE_TIMEOUT_MS / 1000,
             what="every automation's switch", interval=0.3)
    _shoot(page, directory, "automation.png")


def test_materialize_customer_status_in_a_browser_succeeds_and_screenshots_show_the_ui(
    start_ui: Callable[..., AbstractContextManager[UiServer]], browser: Any, engine: sa.Engine, cipher: DobCipher,
    tmp_path: Path,
) -> None:
    seed_customers(engine, cipher, ROWS, run_date=date(2025, 6, 1), seed=16)
    target = os.environ.get(SCREENSHOTS_VAR, "").strip()
    directory = (REPO / target) if target else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)

    with start_ui() as server:
        page = browser.new_page()
        run_id = _materialize_in_the_browser(page, server)

        deadline = time.monotonic() + RUN_TIMEOUT_S
        finished = {"SUCCESS", "FAILURE", "CANCELED"}
        while (status := next(r["status"] for r in _runs(server) if r["runId"] == run_id)) not in finished:
            assert time.monotonic() < deadline, f"run {run_id} still {status} after {RUN_TIMEOUT_S:.0f}s"
            time.sleep(1.0)  # polling interval of a deadline loop
        assert status == "SUCCESS", server.output()[-3000:]
        # The run page says so too, and the sweep computed every seeded row.
        page.goto(f"{server.url}/runs/{run_id}")
        page.get_by_text("Success", exact=True).first.wait_for()
        with engine.connect() as conn:
            computed = conn.exec_driver_sql(
                "SELECT count(*) FROM customers WHERE next_review_date IS NOT NULL").scalar_one()
        assert computed == ROWS

        _lineage(page, server, directory)
        _asset_page(page, server, directory)
        _automation(page, server, directory)
    shots = sorted(p.name for p in directory.glob("*.png"))
    assert shots == ["automation.png", "customer_status_checks.png", "customer_status_plots.png", "lineage.png"]
