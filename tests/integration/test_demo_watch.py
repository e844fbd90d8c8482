"""What ``kmq demo --ui`` tells as it happens, over a real SQLite audit store and a real
loopback webhook: each breaker transition once, in words, the closing with how long the outage
lasted; each alert as the webhook receives it."""

from __future__ import annotations

import re

from kmq_dagster.audit.breaker_state import StoredBreaker
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import State, Transition
from kmq_dagster.core.queue import Queue
from kmq_dagster.defs.alert_sinks import Alert, WebhookSink
from kmq_dagster.demo.watch import alert_receiver, watching_breaker
from tests.kafka_helpers import wait_for

QUEUE = Queue("orders", "pricing")


def move(
    breaker: StoredBreaker, before: State, after: State, reason: str, version: int | None
) -> None:
    transition = Transition(before, after, 0, 1.0, 20, reason, 0, 20_000)
    assert breaker.write(transition, expected_version=version)


def test_each_transition_is_told_once_in_words_and_the_close_says_how_long(
    private_audit_store: str,
) -> None:
    store = AuditStore(private_audit_store)
    breaker = StoredBreaker(store, QUEUE, window_ms=30_000)
    move(breaker, State.CLOSED, State.OPEN, "an outage before the demo watched", None)
    move(breaker, State.OPEN, State.CLOSED, "it ended", 1)
    lines: list[str] = []

    with watching_breaker(private_audit_store, QUEUE, lines.append) as opened:
        assert not opened.is_set()  # the earlier outage does not count
        move(breaker, State.CLOSED, State.OPEN, "error rate 100% over 20 messages in 30s", 2)
        assert wait_for(lambda: len(lines) == 1, timeout_s=30)
        assert opened.is_set()
        move(breaker, State.OPEN, State.HALF_OPEN, "cooldown over: probing", 3)
        move(breaker, State.HALF_OPEN, State.CLOSED, "3 of 3 messages processed", 4)
        assert wait_for(lambda: len(lines) == 3, timeout_s=30)

    assert lines[:2] == [
        "breaker opened: error rate 100% over 20 messages in 30s",
        "breaker probing: cooldown over: probing",
    ]
    # the close counts from the opening the watch saw, not the earlier outage
    assert re.fullmatch(r"breaker closed after (\d+ ms|\ds): 3 of 3 messages processed", lines[2])
    store.close()


def test_alerts_are_told_as_the_webhook_receives_them() -> None:
    lines: list[str] = []
    alert = Alert(kind="breaker_open", severity="critical", subject="orders / pricing",
                  title="circuit breaker open", text="closed -> open: error rate 100%",
                  key="orders/pricing#1")  # fmt: skip

    with alert_receiver(lines.append) as url:
        WebhookSink(url).send(alert)

    assert lines == [
        "alert sent: [critical] orders / pricing: circuit breaker open "
        "(closed -> open: error rate 100%)"
    ]
