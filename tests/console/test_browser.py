"""The console end to end in a real browser (Debian's Chromium driven by Playwright) against
``kmq console`` as a real process, the real broker and a real worker: an operator logs in,
filters, opens a dead letter whose value and headers carry XSS payloads (shown literally,
never run), replays 10 dead letters with a dry run then for real, and sees them processed and
audited; a viewer gets no replay control and the action itself refuses them. Every page is
read at 1280x900, a laptop with the sidebar open: every table cell whole and on screen
(:mod:`tests.console.screen_checks`). The screenshots in docs/guides/console.md are taken here
(``KMQ_SCREENSHOTS=1``)."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from streamlit.runtime.memory_media_file_storage import _calculate_file_id

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import ADMIN, OPERATOR, VIEWER, Principal, UsersFile
from kmq_dagster.console.login_guard import LOGIN_FAILED
from kmq_dagster.console.operations import ReplayPlan, start_replay
from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.login_throttle import FREE_FAILURES
from kmq_dagster.core.naming import dlq_topic, redelivery_topic
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.errors import PermissionDeniedError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.console.console_process import running_console
from tests.console.screen_checks import assert_whole, grids, tables
from tests.kafka_helpers import new_queue, running_worker, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.kafka]

CHROMIUM = "/usr/bin/chromium"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
GROUP = "billing"
PASSWORD = "a long enough password"
XSS_VALUE = '<img src=x onerror="window.__xss=1;alert(1)">'
XSS_HEADER = "<script>window.__xss=2</script>"
XSS_MESSAGE = "**bold** <b>tag</b> <script>window.__xss=3</script>"
CARD = "4111111111111111"
OUTAGE = (
    "error rate 90% over 20 messages in 30s (copies to the retry topics): the payments API "
    "answered 503 to every call from 06:01:12 UTC; the worker paused fetching, Spark runs "
    "stopped between batches and the backlog sensor held new runs back"
)


#: How long a page may take to load or a Streamlit run to finish: on a loaded two-core machine
#: (load average 25) page loads and reruns took over 30 s.
PAGE_TIMEOUT_MS = 120_000


def new_page(browser: Browser) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # the screen
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    return page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    expect.set_options(timeout=PAGE_TIMEOUT_MS)  # for every expect(...) of this module
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            yield launched
            launched.close()
    finally:
        expect.set_options(timeout=None)  # Playwright's own default again


def produce(settings: KmqSettings, topic: str, items: list[tuple[bytes, str, str, bytes]],
            user_headers: list[tuple[str, bytes]] | None = None) -> None:  # fmt: skip
    """Dead letters (key, error type, message, value) as the retry router writes them."""
    producer = Producer(settings.producer_config())
    for n, (key, error_type, message, value) in enumerate(items):
        headers = copy_headers(
            Origin(topic, n % 2, 1_000 + n, 1_700_000_000_000), GROUP,
            Failure(error_type, message, "Traceback (most recent call last):\n  ...\n"),
            attempt=4, dlq_reason=f"failed 4 attempts, the last with {error_type}",
        )  # fmt: skip
        producer.produce(dlq_topic(topic, GROUP), key=key, value=value, partition=n % 2,
                         headers=[*replace_headers(user_headers or [], headers)])  # fmt: skip
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def topic_name() -> str:
    """A short queue name: it shows in the README's screenshots."""
    return f"orders-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def audit_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('browser') / 'audit.db'}"


@pytest.fixture(scope="module")
def console(
    settings: KmqSettings,
    topic_name: str,
    tmp_path_factory: pytest.TempPathFactory,
    audit_url: str,
) -> Iterator[str]:
    """``kmq console`` on a free port over a DLQ of 10 timeouts, 4 key errors and a poisoned
    dead letter, with a breaker, an alert and a snapshot; yields its URL."""
    # (a DLQ of 2 partitions, as the dead letters below are written to)
    new_queue(settings, topic_name, GROUP, partitions=2, aux_partitions=2, retry_delays_ms=(1_000,))
    orders = [json.dumps({"order": n, "amount": 19.9 + n, "currency": "EUR"}).encode()
              for n in range(14)]  # fmt: skip
    produce(settings, topic_name, [
        *((f"order-{n}".encode(), "TimeoutError", f"payments API timed out after {20 + n} s",
           orders[n]) for n in range(10)),
        *((f"order-{n}".encode(), "KeyError", "'customer_id'", orders[n]) for n in range(10, 14)),
    ], [("trace-id", b"4bf92f3577b34da6")])  # fmt: skip
    poisoned = json.dumps({"note": XSS_VALUE, "card_number": CARD}).encode()
    produce(settings, topic_name, [(b"<b>key</b>", "ValueError", XSS_MESSAGE, poisoned)],
            [("x-note", XSS_HEADER.encode()), ("Authorization", b"Bearer s3cr3t")])  # fmt: skip
    tmp_path = tmp_path_factory.mktemp("console")
    fill_store(settings, topic_name, audit_url)
    users = UsersFile(tmp_path / "users.json")
    users.add(Principal("root", ADMIN), "olivia", OPERATOR, PASSWORD)
    users.add(Principal("root", ADMIN), "victor", VIEWER, PASSWORD)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_CONSOLE_USERS_FILE": str(tmp_path / "users.json"),
        "KMQ_CONSOLE_REFRESH_S": "5",
    }
    with running_console(tmp_path, env, audit_url) as url:
        yield url


def fill_store(settings: KmqSettings, topic: str, url: str) -> None:
    """Ingest the DLQ; add two hours of snapshots, a breaker that tripped, an alert."""
    store = AuditStore(url)
    ingester = DlqIngester(open_queue(settings, topic, GROUP), store)
    ingester.ingest_available()
    ingester.close()
    now = datetime.now(UTC)
    queue = {"queue_topic": topic, "group_id": GROUP}
    for minutes in range(120, -1, -5):
        store.record_snapshot(
            at=now - timedelta(minutes=minutes), lag=max(0, 2_000 - abs(minutes - 60) * 30),
            inflight=40, oldest_unacked_age_ms=2_300, in_rate=180.0, ack_rate=175.5, **queue,
        )  # fmt: skip
    # closed again after an opening: its last opening stays stored in the row
    opened_ms = int((now - timedelta(minutes=3)).timestamp() * 1000)
    store.save_breaker_state(topic, GROUP, state="closed", opened_at_ms=opened_ms,
                             cooldown_ms=10_000, expected_version=None)  # fmt: skip
    for before, after in [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]:
        store.record_transition(
            at=now, from_state=before, to_state=after, error_rate=0.9, window_calls=20,
            window_ms=30_000, reason="payments API outage", **queue,
        )  # fmt: skip
    store.record_alert(severity="critical", message="circuit breaker closed -> open", **queue)
    # as versions before one spelling for people stored it
    store.record_alert(severity="warning", message="circuit breaker open -> half_open: probing",
                       **queue)  # fmt: skip
    store.record_alert(severity="critical", message=f"circuit breaker closed -> open: {OUTAGE}",
                       **queue)  # fmt: skip
    # a second group, idle: nothing in flight
    store.record_snapshot(queue_topic=topic, group_id="reporting", lag=0, inflight=0,
                          oldest_unacked_age_ms=None, in_rate=180.0, ack_rate=180.0)  # fmt: skip
    store.close()


def test_an_operator_filters_inspects_and_replays_ten_dead_letters_in_the_browser(
    console: str, browser: Browser, settings: KmqSettings, topic_name: str, audit_url: str
) -> None:
    page = new_page(browser)
    alerts: list[str] = []

    def on_dialog(dialog: Dialog) -> None:  # an alert() from a payload that ran
        alerts.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    log_in(page, console, "olivia")
    updated = page.get_by_text(re.compile(r"^Updated "))
    expect(updated).to_be_visible(timeout=60_000)
    settle(page)
    # on-call figures: rates and ages in units, "-" for nothing in flight, never None
    cells = page.locator("td").all_text_contents()
    assert {"180 /s", "2s", "-", "15 new", "none"} <= set(cells) and "None" not in cells, cells
    assert any(re.fullmatch(r"closed for \d+[smh].*", c) for c in cells), cells
    expect(page.get_by_text(OUTAGE)).to_be_visible()  # the long alert, whole and wrapped
    # at 1280x900 every cell whole (the breaker first of all), in words, not "DL new"
    summary = tables(page)[0]["header"]
    assert summary[:4] == ["queue", "group", "breaker", "dead letters"], summary
    assert_whole(page)
    halves = [c for c in cells if "half" in c]  # (a markdown table draws -> as an arrow)
    assert [re.sub(r"open \S+ half", "open -> half", c) for c in halves] == [
        "circuit breaker open -> half-open: probing"], halves  # fmt: skip
    # the arrivals of the last hour by default: a day of 10-minute bars squeezes a burst
    expect(page.get_by_role("combobox", name="Charts")).to_have_value("last hour")
    shoot(page, "overview")
    first_update = updated.inner_text()
    expect(updated).not_to_have_text(first_update, timeout=PAGE_TIMEOUT_MS)  # it refreshed itself

    page.get_by_role("link", name="Dead letters").click()
    settle(page)
    # the filter in words; all 15 rows of the page shown, every cell whole and on screen
    expect(page.get_by_text("Showing new dead letters", exact=True)).to_be_visible()
    expect(page.locator("td", has_text="failed 4 attempts, the last with KeyError").first
           ).to_be_attached()  # fmt: skip
    listed = grids(page)[0]
    assert listed["rows"] == 15 and "reason" in listed["titles"], listed
    assert_whole(page)
    show_causes(page)
    expect(page.locator("td", has_text="'customer_id'").first).to_be_attached()
    # each cause's name whole beside its count's bar (no chart with labels cut short)
    assert page.get_by_test_id("stVegaLiteChart").count() == 0
    assert [[t for t in g["titles"] if t] for g in grids(page)] == [  # less the tick boxes
        ["error type", "error pattern", "count", "latest"]]  # fmt: skip
    assert_whole(page)
    shoot(page, "by-cause")
    page.get_by_role("radio", name="List").click()
    apply_filter(page, "Error type", "ValueError")
    choose(page, "Open dead letter", "ValueError")
    heading = page.get_by_role("heading", name=re.compile(r"Dead letter #\d+"))
    expect(heading).to_be_visible()
    heading.evaluate("element => element.scrollIntoView({block: 'start'})")
    expect(page.get_by_text(XSS_VALUE)).to_be_visible()  # the value, as JSON text
    expect(page.get_by_text(CARD)).to_have_count(0)  # masked
    shoot(page, "detail")
    page.get_by_role("tab", name="Headers").click()
    settle(page)
    cells = page.locator("td").all_text_contents()
    assert XSS_HEADER in cells and "****" in cells and "Bearer s3cr3t" not in cells
    page.get_by_role("tab", name="Error").click()
    expect(page.get_by_text(XSS_MESSAGE).filter(visible=True).first).to_be_visible()
    assert page.evaluate("window.__xss") is None and alerts == []
    assert page.locator("img[src=x], b:text('tag')").count() == 0

    processed: list[KmqMessage] = []
    with running_worker(open_queue(settings, topic_name, GROUP), processed.append):
        apply_filter(page, "Error type", "TimeoutError")
        expect(page.get_by_text("Page 1: 10 of 10 matching")).to_be_visible()
        shoot(page, "dead-letters")
        page.get_by_role("button", name="Replay all matching (10)").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_role("button", name="Dry run").click()
        target = redelivery_topic(topic_name, GROUP)
        expect(dialog.get_by_text(f"Dry run: 10 dead letters would be replayed to {target}.")
               ).to_be_visible()  # fmt: skip
        # keys as the Dead letters page shows them, not as Python shows bytes
        expect(dialog.locator("td", has_text="order-3").first).to_be_attached()
        assert "b'" not in " ".join(dialog.locator("td").all_text_contents())
        assert_whole(page)
        shoot(page, "replay-dialog")
        dialog.get_by_role("button", name="Replay 10 dead letters").click()
        expect(page.get_by_text(f"10 dead letters to {target}")).to_be_visible()
        assert wait_for(lambda: len(processed) == 10, timeout_s=60), len(processed)
    assert sorted(m.key or b"" for m in processed) == sorted(
        f"order-{i}".encode() for i in range(10)
    )

    page.get_by_role("link", name="Actions").click()
    expect(page.get_by_text("replayed 10 of 15 dead letters").first).to_be_visible()
    expect(page.locator("td", has_text="olivia").first).to_be_attached()
    # one replay, one id: the job names the replay id the audit trail names
    job = page.get_by_text(re.compile(r"^Replay \w+ by olivia")).first.inner_text()
    replay_id = job.split()[1]
    expect(page.locator("td", has_text=f"(replay id {replay_id})").first).to_be_attached()
    shoot(page, "actions")
    page.get_by_role("link", name="Breakers & alerts").click()
    settle(page)
    expect(page.get_by_role("heading", name="Alerts", exact=True)).to_be_visible()
    # error rates as percentages (wait for the transitions table: it renders after the states)
    expect(page.locator("td", has_text="90%").first).to_be_attached()
    cells = page.locator("td").all_text_contents()
    assert "0.9" not in cells, cells
    # a closed breaker has no "opened at"; one spelling of half-open; every reason whole
    states = tables(page)[0]
    assert states["header"][:5] == ["queue", "group", "state", "since", "opened at"], states
    row = page.get_by_test_id("stTable").first.locator("tbody tr").first
    assert row.locator("td").all_text_contents()[2:5:2] == ["closed", "-"]
    joined = " ".join(cells)
    assert "half-open" in joined and "half_open" not in joined, cells
    assert_whole(page)
    shoot(page, "breakers")
    store = AuditStore(audit_url)
    assert store.count_dead_letters(DeadLetterFilter(status="replayed")) == 10
    assert [(a.actor, a.dry_run, a.count) for a in store.actions()] == [
        ("olivia", True, 10), ("olivia", False, 10)]  # fmt: skip
    store.close()
    page.close()


def test_a_viewer_gets_no_replay_control_and_the_action_refuses_them(
    console: str, browser: Browser, settings: KmqSettings, audit_url: str
) -> None:
    page = new_page(browser)
    log_in(page, console, "victor")
    page.get_by_role("link", name="Dead letters").click()
    settle(page)

    expect(page.get_by_text("replay and discard need the operator role")).to_be_visible()
    expect(page.get_by_role("button", name="Replay all matching")).to_have_count(0)
    expect(page.get_by_role("button", name="Discard all matching")).to_have_count(0)
    store = AuditStore(audit_url)
    before = len(store.actions())
    with pytest.raises(PermissionDeniedError, match="victor is a viewer"):
        start_replay(Principal("victor", VIEWER), settings, store, ReplayPlan(DeadLetterFilter()))
    assert len(store.actions()) == before
    store.close()
    page.close()


def test_a_499_deep_dead_letter_renders_exports_once_and_can_be_discarded(
    console: str, browser: Browser, settings: KmqSettings, topic_name: str, audit_url: str
) -> None:
    deep = b"[" * 499 + b"]" * 499
    produce(settings, topic_name, [(b"deep", "RecursionBomb", "499 arrays deep", deep)],
            [("X-Auth-Token", b"tok-secret-1")])  # fmt: skip
    store = AuditStore(audit_url)
    ingester = DlqIngester(open_queue(settings, topic_name, GROUP), store)
    ingester.ingest_available()
    ingester.close()
    page = new_page(browser)
    log_in(page, console, "olivia")
    page.get_by_role("link", name="Dead letters").click()
    settle(page)
    apply_filter(page, "Error type", "RecursionBomb")
    expect(page.get_by_text("Page 1: 1 of 1 matching")).to_be_visible()
    choose(page, "Open dead letter", "RecursionBomb")
    expect(page.get_by_text(re.compile("nested more than 64 levels"))).to_be_visible()

    assert page.locator("a[href*='/media/']").count() == 0  # no file before the click
    with page.expect_download() as started:
        page.get_by_role("button", name="Download as JSON (masked)").click()
    download = started.value
    exported = json.loads(Path(download.path()).read_text())
    assert exported["value"] == deep.decode() and "tok-secret-1" not in json.dumps(exported)
    # Served under a random name of its own, never Streamlit's content-hash name (the same
    # for the same export); the URL the operator got, fetched later without their session: gone.
    content_hash = _calculate_file_id(
        Path(download.path()).read_bytes(), "application/json", download.suggested_filename
    )
    assert content_hash not in download.url
    assert (
        _status(download.url.replace(download.url.rsplit("/", 1)[1], f"{content_hash}.json")) == 404
    )
    assert wait_for(lambda: _status(download.url) == 404, timeout_s=30), _status(download.url)

    page.get_by_role("button", name="Discard all matching (1)").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Reason (required; kept in the audit log)").fill("poison: 499 deep")
    dialog.get_by_role("button", name="Discard 1 dead letter").click()
    expect(page.get_by_text("Discarded 1 dead letter.")).to_be_visible()
    done = DeadLetterFilter(error_type="RecursionBomb", status="discarded")
    assert store.count_dead_letters(done) == 1
    store.close()
    page.close()


def log_in(page: Page, url: str, name: str) -> None:
    page.goto(url)
    page.get_by_role("textbox", name="User name").fill(name)
    page.get_by_role("textbox", name="Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    settle(page)


def apply_filter(page: Page, label: str, value: str) -> None:
    page.get_by_label(label, exact=True).fill(value)
    page.get_by_role("button", name="Apply filters").click()
    # the page says the filter it shows (a settle alone may look before the run began)
    shown = re.compile(rf"^Showing .*{label.lower()} {re.escape(value)}")
    expect(page.get_by_text(shown)).to_be_visible(timeout=60_000)
    settle(page)


def choose(page: Page, label: str, option_text: str) -> None:
    combobox = page.get_by_role("combobox", name=label)
    options = page.get_by_role("option")
    option = options.filter(has_text=re.compile(re.escape(option_text))).first
    for _ in range(5):
        # A rerun the page was still finishing may close the list just opened (or make the
        # box anew): open it only if it is shut (a click on an open list shuts it), and
        # start again from a shut list after a miss.
        if combobox.get_attribute("aria-expanded") != "true":
            combobox.click()
        try:
            option.wait_for(timeout=10_000)
            # Such a rerun may also shut the list between finding the option and clicking
            # it: the click then waits for an option that is gone (120 s in a CI run).
            option.click(timeout=10_000)
            break
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")
            settle(page)
    else:
        raise AssertionError(
            f"no option with {option_text!r} in {label!r} after 5 openings; listed: "
            f"{options.all_inner_texts()}"
        )
    settle(page)


def show_causes(page: Page) -> None:
    """Switch the dead letters' page to its counts by cause, and wait until they are drawn."""
    page.get_by_role("radio", name="By cause").click()
    settle(page)
    expect(page.get_by_text("Click a cause to list its dead letters.")).to_be_visible()


def settle(page: Page) -> None:
    """Wait until Streamlit has finished the run the last action started: no "running"
    status, and no element of the previous run left (Streamlit marks those stale)."""
    page.wait_for_timeout(500)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " && !document.querySelector('[data-stale=\"true\"]')",
        timeout=PAGE_TIMEOUT_MS,
    )


def shoot(page: Page, name: str) -> None:
    """Screenshot the page for the console guide when KMQ_SCREENSHOTS=1 (the tracked images
    stay as they are on ordinary test runs); always render it, so a page that cannot be drawn
    fails."""
    image = page.screenshot()
    if os.environ.get("KMQ_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        (IMAGES / f"console-{name}.png").write_bytes(image)


def _status(url: str) -> int:
    """The HTTP status of an unauthenticated GET of ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_failed_logins_are_throttled_and_audited_in_the_real_console(
    console: str, browser: Browser, audit_url: str
) -> None:
    """Last in this module: it locks this machine out of the console for a while."""
    page = new_page(browser)
    page.goto(console)
    messages: list[str] = []
    # The first lock lasts 1 s and each failure doubles it: a loaded machine's next attempt
    # can come after a short lock ended, never after a 64 s one.
    while len(messages) < FREE_FAILURES + 8 and not (messages and "too many" in messages[-1]):
        page.get_by_role("textbox", name="User name").fill("victor")
        page.get_by_role("textbox", name="Password").fill("not the password")
        page.get_by_role("button", name="Log in").click()
        settle(page)
        messages.append(page.get_by_role("alert").last.inner_text())

    wrong = messages[:-1]
    assert wrong[: FREE_FAILURES + 1] == ["Wrong user name or password."] * (FREE_FAILURES + 1)
    assert set(wrong) == {"Wrong user name or password."}
    assert "too many failed logins: try again in" in messages[-1]
    store = AuditStore(audit_url)
    failed = [a.actor for a in store.actions() if a.kind == LOGIN_FAILED]
    assert failed == ["victor from localhost"] * len(wrong)
    store.close()
    page.close()
