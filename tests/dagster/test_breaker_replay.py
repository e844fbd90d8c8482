"""A replay is not a failure (invariant 12), on the real broker, the real breaker sensor and a
real SQLite audit store: 200 dead letters of an outage, replayed into the group once its
service is healthy again, are processed while the sensor ticks, and neither the sensor nor the
workers' shared breaker opens, and no alert goes out. The control: the same replay into a
group whose service is still down fails again, and the sensor opens the breaker on those
failures, so replayed copies are told apart from failures, not ignored. That a plain failure
flood opens it is ``test_breaker_sensor.py::test_a_failure_flood_opens_alerts_throttles_and_
recovery_resolves``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from tests.dagster.helpers import QueueUnderTest, declare
from tests.dagster.receivers import HttpReceiver, http_receiver
from tests.kafka_helpers import WaitBudget, produce, running_worker, wait_for

pytestmark = pytest.mark.kafka

COUNT = 200
#: A window longer than the test, so every message it processes is judged.
CONFIG = BreakerConfig(
    window_ms=600_000, min_calls=10, error_rate=0.5, cooldown_ms=300_000, probes=3
)
#: Two retries, so a replayed copy (its second attempt) that fails goes to a retry topic;
#: a minute away, so none comes back during the test.
RETRIES = RetryPolicy.fixed((60_000, 60_000))


class PaymentServiceDown(RuntimeError):
    pass


def payment_service_down(_message: KmqMessage) -> None:
    raise PaymentServiceDown("payment service unavailable")


def healthy(_message: KmqMessage) -> None:
    return None


def message(result: Any) -> str:
    return str(result.skip_reason.skip_message)


def judged(result: Any) -> int:
    """How many messages a closed breaker's tick judged ("... over 200 messages ...")."""
    found = re.search(r"over ([\d,]+) messages", message(result))
    assert found, message(result)
    return int(found.group(1).replace(",", ""))


def breaker_state(q: QueueUnderTest, audit: AuditStoreResource) -> str:
    row = audit.get_store().breaker_state(q.spec.queue.topic, q.spec.queue.group)
    return row.state if row is not None else "closed"


def tick_until(
    q: QueueUnderTest, cursor: str, done: Callable[[Any], bool], budget: WaitBudget
) -> list[Any]:
    """Tick the breaker sensor (its cursor carried on, as the daemon does) until ``done`` says
    so of a tick; returns every tick."""
    ticks: list[Any] = []

    def ticked() -> bool:
        ticks.append(q.tick("breaker", ticks[-1].cursor if ticks else cursor))
        return done(ticks[-1])

    assert wait_for(ticked, timeout_s=budget.left_s(), interval_s=0.5), message(ticks[-1])
    return ticks


def outage_replayed(
    topic: str,
    tmp_path: Path,
    instance: DagsterInstance,
    kmq: KmqResource,
    audit: AuditStoreResource,
    hook: HttpReceiver,
    budget: WaitBudget,
) -> tuple[QueueUnderTest, str]:
    """``COUNT`` messages dead-lettered by an outage (fatal errors), ingested and replayed
    into the group; returns the queue and the breaker sensor's cursor from before the replay."""
    q = declare(topic, tmp_path, instance, kmq, audit, breaker=CONFIG, retry_policy=RETRIES)
    q.resources["alerts"] = KmqAlertsResource(webhook_url=hook.url, min_period_s=300)
    opened = kmq.open_queue(q.spec.queue)
    store = audit.get_store()
    produce(kmq.get_settings(), topic, [b"order-%d" % i for i in range(COUNT)], partitions=2)
    fatal = opened.with_non_retryable(["PaymentServiceDown"])
    ingester = DlqIngester(opened, store)
    shared = SharedBreaker.for_queue(opened.queue, store, CONFIG)  # fatal errors never count
    try:
        with running_worker(fatal, payment_service_down, breaker=shared):

            def ingested() -> bool:
                ingester.ingest_available()
                return store.count_dead_letters() >= COUNT

            assert wait_for(ingested, timeout_s=budget.left_s(), interval_s=0.5)
    finally:
        ingester.close()
    assert store.count_dead_letters() == COUNT
    before = q.tick("breaker")
    assert message(before).startswith("breaker closed"), message(before)

    report = replay_dead_letters(opened, ReplayRequest(), audit=store, actor="olivia")

    assert report.replayed == COUNT, report.summary()
    return q, before.cursor


@dataclass(frozen=True)
class ReplayedOutage:
    """An outage's dead letters replayed into the group (:func:`outage_replayed`)."""

    q: QueueUnderTest
    #: The breaker sensor's cursor from before the replay.
    cursor: str
    #: Where the alerts go.
    hook: HttpReceiver
    #: What is left of the test's 200 s.
    budget: WaitBudget


@pytest.fixture
def replayed(
    topic_name: str,
    tmp_path: Path,
    instance: DagsterInstance,
    kmq: KmqResource,
    audit: AuditStoreResource,
) -> Iterator[ReplayedOutage]:
    budget = WaitBudget(200)
    with http_receiver() as hook:
        q, cursor = outage_replayed(topic_name, tmp_path, instance, kmq, audit, hook, budget)
        yield ReplayedOutage(q, cursor, hook, budget)


def test_replaying_an_outages_dead_letters_into_a_healthy_group_never_opens_its_breaker(
    kmq: KmqResource, audit: AuditStoreResource, replayed: ReplayedOutage
) -> None:
    # given 200 dead letters of an outage, replayed into the group once it is over
    q = replayed.q
    store = audit.get_store()
    shared = SharedBreaker.for_queue(q.spec.queue, store, CONFIG)

    # when the group's worker (with the shared breaker) processes the copies while the
    # breaker sensor ticks
    with running_worker(kmq.open_queue(q.spec.queue), healthy, breaker=shared) as worker:

        def all_judged(tick: Any) -> bool:
            said = message(tick)
            assert said.startswith("breaker closed, error rate 0%"), said
            return worker.stats.handled >= COUNT and judged(tick) >= COUNT

        ticks = tick_until(q, replayed.cursor, all_judged, replayed.budget)
    # then every copy was processed, counted as work done and none as a failure; neither
    # breaker moved, and nobody was paged
    assert worker.stats.handled == COUNT and worker.stats.failed == 0
    assert len(ticks) > 1, "the sensor ticked while the copies were processed"
    assert judged(ticks[-1]) == COUNT, message(ticks[-1])
    assert breaker_state(q, audit) == "closed"
    assert store.transitions(q.spec.queue.topic, q.spec.queue.group) == []
    assert store.alerts(q.spec.queue.topic) == []
    assert replayed.hook.bodies() == []


def test_replayed_copies_that_fail_again_open_the_breaker(
    kmq: KmqResource, audit: AuditStoreResource, replayed: ReplayedOutage
) -> None:
    # given the same 200 dead letters, replayed while the service is still down
    q = replayed.q

    # when a worker without a breaker of its own (so only the sensor can open it) fails
    # them again, retryably: each goes on to its next retry topic
    with running_worker(kmq.open_queue(q.spec.queue), payment_service_down):
        ticks = tick_until(
            q, replayed.cursor, lambda _: breaker_state(q, audit) == "open", replayed.budget
        )
    # then the sensor counted those failures and opened the breaker, and paged
    assert message(ticks[-1]).startswith("breaker opened: error rate 100% over "), message(
        ticks[-1]
    )
    assert message(ticks[-1]).endswith("; alert sent: circuit breaker open")
    assert [b["kind"] for b in replayed.hook.bodies()] == ["breaker_open"]
