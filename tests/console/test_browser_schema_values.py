"""An Avro dead letter in the real console, in a real browser (Debian's Chromium): its decoded
fields shown with the password masked, its subject and version, found by "Text in value" by a
field and never by the password, and exported decoded in the CSV; an undecodable framed value
shows its placeholder and hex. The console process has no registry setting: it reads what the
ingester decoded and stored (the ingest ran here, against confluent-kafka's ``mock://``
registry, with values made by its ``AvroSerializer``)."""

from __future__ import annotations

import csv
import io
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import ADMIN, OPERATOR, Principal, UsersFile
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.schemas import RegistrySettings, registry_client
from kmq_dagster.settings import KmqSettings
from tests.console.console_process import running_console
from tests.console.test_browser import (
    PASSWORD,
    browser,  # noqa: F401 (the module's Chromium, a fixture)
    choose,
    log_in,
    new_page,
    settle,
    shoot,
)
from tests.kafka_helpers import new_queue
from tests.support.schema_values import encode, produce_dead_letters

pytestmark = [pytest.mark.browser, pytest.mark.kafka]

SECRET = "hunter2-in-avro"
ORDER = {"order_id": "AV-4711", "password": SECRET, "amount": 99.5}
UNKNOWN_ID = b"\x00\x00\x00\x03\xe7\x0eunknown"


def search(page: Page, text: str) -> None:
    """Filter by "Text in value or error message" and wait for the page to show it."""
    page.get_by_label("Text in value or error message", exact=True).fill(text)
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_text(re.compile(rf"^Showing .*{re.escape(text)}"))).to_be_visible()
    settle(page)


@pytest.fixture(scope="module")
def console(settings: KmqSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``kmq console`` over an ingested Avro dead letter and an undecodable one."""
    topic = f"avro-{uuid.uuid4().hex[:6]}"
    tmp_path = tmp_path_factory.mktemp("schema-console")
    audit_url = f"sqlite:///{tmp_path / 'audit.db'}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KMQ_SCHEMA_REGISTRY_URL", f"mock://{topic}")
        client = registry_client(RegistrySettings.from_env())
        opened = new_queue(settings, topic, "billing")
        produce_dead_letters(settings, opened.queue, [
            (b"avro-order", "PricingError", encode(client, "avro", topic, ORDER)),
            (b"mystery", "PricingError", UNKNOWN_ID),
        ])  # fmt: skip
        store = AuditStore(audit_url)
        ingester = DlqIngester(opened, store)
        try:
            assert ingester.ingest_available().stored == 2
        finally:
            ingester.close()
            store.close()
    users = UsersFile(tmp_path / "users.json")
    users.add(Principal("root", ADMIN), "olivia", OPERATOR, PASSWORD)
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("KMQ_SCHEMA_REGISTRY")}
    env_vars |= {"HOME": str(tmp_path), "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
                 "KMQ_CONSOLE_USERS_FILE": str(tmp_path / "users.json")}  # fmt: skip
    with running_console(tmp_path, env_vars, audit_url) as url:
        yield url


def test_an_avro_dead_letter_shows_its_decoded_fields_masked_in_the_browser_and_is_found(
    console: str,
    browser: Browser,  # noqa: F811
) -> None:
    page = new_page(browser)
    log_in(page, console, "olivia")
    page.get_by_role("link", name="Dead letters").click()
    settle(page)

    choose(page, "Open dead letter", "avro-order")
    expect(page.get_by_text(re.compile(r"Decoded from avro, subject avro-\w+-value version 1"))
           ).to_be_visible()  # fmt: skip
    value = page.get_by_test_id("stJson")
    expect(value).to_contain_text("AV-4711")
    expect(value).to_contain_text("****")
    expect(page.locator("td", has_text=re.compile(r"^avro, subject avro-\w+-value version 1"))
           ).to_be_attached()  # fmt: skip
    assert SECRET not in page.content()
    value.scroll_into_view_if_needed()
    shoot(page, "schema-value")

    with page.expect_download() as started:
        page.get_by_role("button", name="Download this page as CSV (masked)").click()
    rows = list(csv.DictReader(io.StringIO(Path(started.value.path()).read_text())))
    (avro,) = [r for r in rows if r["key"] == "avro-order"]
    assert '"order_id": "AV-4711"' in avro["value"] and '"password": "****"' in avro["value"]
    assert re.fullmatch(r"avro, subject avro-\w+-value version 1 \(schema id \d+\)",
                        avro["value schema"])  # fmt: skip
    (mystery,) = [r for r in rows if r["key"] == "mystery"]
    assert mystery["value"] == "(undecodable, schema id 999) 0x" + UNKNOWN_ID.hex()
    assert SECRET not in Path(started.value.path()).read_text()

    search(page, "AV-4711")
    expect(page.get_by_text(re.compile(r"^Page 1: 1 of 1 matching"))).to_be_visible()
    search(page, SECRET)
    expect(page.get_by_text(re.compile(r"^Page 1: 0 of 0 matching"))).to_be_visible()

    # an undecodable framed value: a placeholder, and its bytes in hex
    search(page, "unknown")
    choose(page, "Open dead letter", "mystery")
    expect(page.get_by_text(re.compile(r"Undecodable Schema Registry value \(schema id 999\)"))
           ).to_be_visible()  # fmt: skip
    expect(page.get_by_text(re.compile(r"^00000000  00 00 00 03 e7 0e 75 6e"))).to_be_visible()
    expect(page.locator("td", has_text="format unknown (schema id 999)")).to_be_attached()
    page.close()
