"""The circuit breaker at concurrency 8, on the real broker, shared through a real SQLite audit
store as a group's workers share it: another worker opens it while 8 calls are in flight; the
calls in flight finish and are acknowledged, no new call starts while it is open, one probe
runs once it half-opens, and after it closes every message is handled once."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pytest

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.integration.test_shared_breaker import fail
from tests.kafka_helpers import (
    WaitBudget,
    new_queue,
    produce,
    read_topic,
    running_service,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: A cooldown long enough for the calls in flight to end while the breaker is still open.
CONFIG = BreakerConfig(min_calls=4, consecutive_failures=4, cooldown_ms=15_000, probes=1)


def test_an_open_breaker_lets_the_calls_in_flight_finish_and_starts_no_new_one(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    queue = new_queue(settings, topic_name, partitions=2, visibility_timeout_ms=8_000)
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    first = [f"first-{i}".encode() for i in range(8)]
    rest = [f"rest-{i:02d}".encode() for i in range(40)]
    release_first = threading.Event()
    # (value, the worker's breaker state as the call started); a list: duplicates show
    calls: list[tuple[bytes, State]] = []
    handled: list[bytes] = []
    breaker = SharedBreaker(CircuitBreaker(CONFIG), queue.queue, store=store)

    def handler(message: KmqMessage) -> None:
        value = message.value or b""
        calls.append((value, breaker.state))
        if value.startswith(b"first-"):
            release_first.wait(60)
        handled.append(value)

    service = Worker(queue, handler, breaker=breaker, concurrency=8, ordering=Ordering.UNORDERED)
    stop = threading.Event()
    worker = threading.Thread(target=service.run, args=(stop,))
    budget = WaitBudget(150)
    with running_service(RedeliveryTracker(queue)) as tracker:
        worker.start()
        try:
            # given 8 calls in flight and 40 messages fetched behind them
            produce(settings, topic_name, first, partitions=2)
            assert wait_for(lambda: len(calls) == 8, budget.left_s()), calls
            produce(settings, topic_name, rest, partitions=2)
            assert wait_for(lambda: service.stats.held == 40, budget.left_s()), service.stats

            # when another worker of the group sees an outage and opens the shared breaker
            fail(
                SharedBreaker(CircuitBreaker(CONFIG), queue.queue, store=store, sync_interval_ms=0),
                4,
                now_ms=wall_clock_ms(),
            )
            assert wait_for(lambda: breaker.state is State.OPEN, budget.left_s()), breaker.state
            # then the calls in flight finish and are acknowledged while it is open
            release_first.set()
            assert wait_for(
                lambda: service.consumer.stats.acked >= 8 and service.stats.calls_in_flight == 0,
                budget.left_s(),
            ), service.stats
            assert breaker.state is State.OPEN, "the cooldown ended before the test looked"
            assert service.stats.held == 40, "messages started while the breaker was open"
            assert service.consumer.stats.acked == 8

            # and after it closes (a probe succeeds) the rest are handled, nothing lost
            assert wait_for(lambda: len(set(handled)) == 48, budget.left_s())
            assert wait_for(lambda: tracker.inflight_count() == 0, budget.left_s())
        finally:
            release_first.set()
            stop.set()
            worker.join(60)

    states_at_start = collections.Counter(state for value, state in calls if value in rest)
    assert State.OPEN not in states_at_start, f"calls started while open: {states_at_start}"
    assert states_at_start[State.HALF_OPEN] == 1  # the probe, then the rest once closed
    assert sorted(handled) == sorted(first + rest)  # each once
    transitions = [(t.from_state, t.to_state) for t in store.transitions(topic_name, queue.group)]
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    copies = [
        record
        for name in [*queue.queue.retry_topics.values(), queue.queue.dlq_topic]
        for record in read_topic(settings, name, 2, timeout_s=3)
    ]
    assert copies == []
