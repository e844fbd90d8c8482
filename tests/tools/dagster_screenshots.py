"""Screenshots of the Dagster UI for README, from a real webserver and daemon on the demo
definitions: ``python -m tests.tools.dagster_screenshots [PAGE ...]`` writes PNGs to docs/images.

Starts an embedded broker and Dagster (webserver + daemon) on free ports, provisions the demo
queue, produces orders so that the backlog sensor launches processing, waits for a
materialization and a few observations, then drives Debian's Chromium with Playwright.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.dagster_service import DagsterService
from kmq_dagster.demo import produce_orders
from kmq_dagster.settings import KmqSettings

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = os.environ.get("KMQ_CHROMIUM", "/usr/bin/chromium")

LAUNCH = """
mutation($location: String!, $job: String!) {
  launchRun(executionParams: {
    selector: {repositoryLocationName: $location, repositoryName: "__repository__", jobName: $job},
    runConfigData: "{}"
  }) { __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } }
}"""
MATERIALIZED = """
query($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset { assetMaterializations(limit: 1) { timestamp } }
  }
}"""


def wait_for_materialization(dagster: DagsterService, path: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = dagster.graphql(MATERIALIZED, {"path": path})["assetOrError"]
        if found and found.get("assetMaterializations"):
            return
        time.sleep(2)
    raise TimeoutError(f"no materialization of {'/'.join(path)} within {timeout_s} s")


def shoot(page: Page, url: str, name: str, wait_text: str | None = None) -> None:
    page.goto(url, wait_until="networkidle")
    skip = page.get_by_role("button", name="Skip")
    if skip.count():
        skip.first.click()  # the "join the community" dialog of a fresh browser profile
    if wait_text:
        page.get_by_text(wait_text).first.wait_for(timeout=30_000)
    time.sleep(2)
    page.screenshot(path=str(IMAGES / f"{name}.png"))
    print(f"wrote docs/images/{name}.png")


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="kmq-shots-") as scratch,
        EmbeddedBroker(port=0) as broker,
    ):
        env = {
            "KMQ_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "KMQ_SESSION_TIMEOUT_MS": "6000",
            "KMQ_AUDIT_URL": f"sqlite:///{scratch}/audit.db",
            "KMQ_DEMO_OUTPUT": f"{scratch}/orders_priced.parquet",
        }
        with DagsterService(
            ROOT / "workspace.yaml", home=Path(scratch, "home"), env=env
        ) as dagster:
            print(f"Dagster at {dagster.url}, logs in {scratch}/home", file=sys.stderr)
            location = dagster.location_name()
            dagster.graphql(LAUNCH, {"location": location, "job": "provision_orders__pricing"})
            settings = KmqSettings(bootstrap_servers=broker.bootstrap_servers)
            time.sleep(10)
            produce_orders(settings, 2_000)
            wait_for_materialization(dagster, ["kmq", "orders__pricing", "output"], 600)
            time.sleep(25)  # a few more observations
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1500, "height": 900})
                shoot(page, f"{dagster.url}/asset-groups/kmq", "dagster-asset-graph")
                shoot(
                    page,
                    f"{dagster.url}/assets/kmq/orders__pricing/queue?view=events",
                    "dagster-queue-observations",
                )
                shoot(
                    page,
                    f"{dagster.url}/assets/kmq/orders__pricing/queue?view=checks",
                    "dagster-queue-checks",
                )
                shoot(page, f"{dagster.url}/runs", "dagster-runs")
                browser.close()


if __name__ == "__main__":
    main()
