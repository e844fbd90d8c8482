"""A Spring Kafka dead-letter topic in the real console (``kmq console`` as a process, Debian's
Chromium): listed as the queue ``<dlt> / spring`` with each dead letter's original topic,
partition and offset, Spring's exception class and message and its consumer group, every cell
whole at 1280x900, and grouped by cause."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import ADMIN, OPERATOR, Principal, UsersFile
from kmq_dagster.kafka.foreign_dlq import open_foreign_dlq
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.console.console_process import running_console
from tests.console.screen_checks import assert_whole, grids
from tests.console.test_browser import (
    PASSWORD,
    browser,  # noqa: F401 (the module's Chromium, a fixture)
    choose,
    log_in,
    new_page,
    settle,
    show_causes,
)
from tests.integration.test_spring_dead_letters import ORIGINS, make_spring_dlt

pytestmark = [pytest.mark.browser, pytest.mark.kafka]


@pytest.fixture(scope="module")
def spring_console(
    settings: KmqSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """``kmq console`` over an ingested Spring DLT; yields its URL and the DLT's name."""
    tmp_path = tmp_path_factory.mktemp("spring-console")
    audit_url = f"sqlite:///{tmp_path / 'audit.db'}"
    original = f"pay-{uuid.uuid4().hex[:6]}"  # short: the cells show it whole
    dlt = f"{original}-dlt"
    make_spring_dlt(settings, original, dlt)
    store = AuditStore(audit_url)
    ingester = DlqIngester(open_foreign_dlq(settings, dlt, "spring"), store)
    ingester.ingest_available()
    ingester.close()
    store.close()
    UsersFile(tmp_path / "users.json").add(Principal("root", ADMIN), "olivia", OPERATOR, PASSWORD)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_CONSOLE_USERS_FILE": str(tmp_path / "users.json"),
    }
    with running_console(tmp_path, env, audit_url) as url:
        yield url, dlt


def test_a_spring_dlt_is_listed_with_its_origins_and_grouped_by_cause_in_the_browser(
    spring_console: tuple[str, str],
    browser: Browser,  # noqa: F811
) -> None:
    url, dlt = spring_console
    original = dlt.removesuffix("-dlt")
    page = new_page(browser)
    log_in(page, url, "olivia")
    page.get_by_role("link", name="Dead letters").click()
    settle(page)
    choose(page, "Queue / group", dlt)  # (a "/" in the option's pattern breaks the selector)
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_text(f"Showing new dead letters of {dlt} / spring")).to_be_visible()
    settle(page)

    for partition, offset in ORIGINS:  # where each came from, and what Spring said
        cell = page.locator("td", has_text=f"{original}[{partition}]@{offset}")
        expect(cell.first).to_be_attached()
        expect(page.locator("td", has_text=f"order {offset} declined").first).to_be_attached()
    # the reason names Spring (and, cut here at the column's edge, its consumer group)
    expect(page.locator("td", has_text="dead-lettered by Spring Kafka").first).to_be_attached()
    listed = grids(page)[0]  # read once the cells above are drawn
    assert listed["rows"] == 5 and "original" in listed["titles"], listed
    assert_whole(page)

    show_causes(page)
    # two causes: Spring's listener exception (its messages differ by a number) and the Error
    expect(page.locator("td", has_text="order <n> declined").first).to_be_attached()
    expect(page.locator("td", has_text="java.lang.Error").first).to_be_attached()
    page.close()
