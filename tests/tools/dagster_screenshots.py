"""Screenshots of the Dagster UI for README, from a real ``kmq demo --ui`` (webserver and
daemon on the demo definitions): ``python -m tests.tools.dagster_screenshots`` writes PNGs to
docs/images and prints when the scripted outage opened and closed the breaker.

Drives Debian's Chromium with Playwright (``KMQ_CHROMIUM`` overrides its path).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.demo.pipeline import DEMO_QUEUE

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = os.environ.get("KMQ_CHROMIUM", "/usr/bin/chromium")


def shoot(
    page: Page, url: str, name: str, click: str | None = None, tick_saying: str | None = None
) -> None:
    """Screenshot ``url``, after clicking the link or tab named ``click`` and opening the
    details of the newest tick whose message contains ``tick_saying``, if given."""
    page.goto(url, wait_until="networkidle")
    skip = page.get_by_role("button", name="Skip")
    if skip.count():
        skip.first.click()  # the "join the community" dialog of a fresh browser profile
    if click is not None:
        page.get_by_text(click, exact=True).first.click()
        page.wait_for_load_state("networkidle")
    if tick_saying is not None:
        open_tick(page, tick_saying)
    deadline = time.monotonic() + 30
    while page.get_by_text("Loading").count() and time.monotonic() < deadline:
        time.sleep(0.5)  # the asset graph fills its nodes in after the page settled
    time.sleep(3)
    page.screenshot(path=str(IMAGES / f"{name}.png"))
    print(f"wrote docs/images/{name}.png", file=sys.stderr)


def open_tick(page: Page, saying: str) -> None:
    """Open the details of the newest sensor tick (of the first 15 listed) whose message
    contains ``saying``: Dagster shows a skipped tick's message there."""
    results = page.get_by_role("button", name="0 runs requested")
    results.first.wait_for(timeout=30_000)
    for row in range(min(results.count(), 15)):
        results.nth(row).click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Skip reason").wait_for(timeout=10_000)
        if dialog.get_by_text(saying).count():
            return
        dialog.get_by_role("button", name=re.compile(r"^(Close|OK|Done)$")).last.click()
        dialog.wait_for(state="hidden", timeout=10_000)
    raise LookupError(f"no tick of the first 15 says {saying!r}")


def wait_for_line(log: Path, pattern: str, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{pattern!r} not printed within {timeout_s} s:\n{log.read_text()}")


def breaker(store: AuditStore) -> str:
    row = store.breaker_state(DEMO_QUEUE.topic, DEMO_QUEUE.group)
    return row.state if row is not None else "closed"


def wait_for_breaker(store: AuditStore, state: str, started: float, timeout_s: float) -> float:
    while time.monotonic() - started < timeout_s:
        if breaker(store) == state:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"the breaker was not {state} within {timeout_s} s")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kmq-shots-") as scratch:
        log = Path(scratch, "demo-ui.log")
        argv = [sys.executable, "-m", "kmq_dagster.cli", "demo", "--ui", "--dagster-port", "0",
                "--output-dir", scratch]  # fmt: skip
        with log.open("w") as out:
            demo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        started = time.monotonic()
        try:
            url = wait_for_line(log, r"Dagster UI:\s+(\S+)", 240).group(1)
            store = AuditStore(wait_for_line(log, r"audit store:\s+(\S+)", 10).group(1))
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1500, "height": 900})
                queue = f"{url}/assets/kmq/orders__pricing/queue"
                automation = f"{url}/overview/automation"
                opened_s = wait_for_breaker(store, "open", started, 300)
                print(f"breaker open {opened_s:.0f} s after the start", file=sys.stderr)
                shoot(page, f"{queue}?view=checks", "dagster-breaker-open")
                shoot(page, automation, "dagster-breaker-sensor", click="breaker_orders__pricing",
                      tick_saying="breaker opened")  # fmt: skip
                shoot(page, automation, "dagster-sensors")
                closed_s = wait_for_breaker(store, "closed", started, 600)
                print(f"breaker closed {closed_s:.0f} s after the start", file=sys.stderr)
                time.sleep(15)
                history = "Execution history"
                shoot(page, f"{queue}?view=checks", "dagster-breaker-history", click=history)
                shoot(page, f"{url}/runs", "dagster-runs")
                shoot(page, f"{url}/asset-groups/kmq", "dagster-asset-graph")
                shoot(page, f"{queue}?view=events", "dagster-queue-observations")
                browser.close()
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(120)
        print(log.read_text(), file=sys.stderr)


if __name__ == "__main__":
    main()
