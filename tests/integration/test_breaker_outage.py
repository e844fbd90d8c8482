"""A 30-second outage of the downstream service with the circuit breaker on, against the real
broker and a real SQLite audit store: it opens within its window, no message reaches the retry
topics or the DLQ while it is open (failed probes wait), the messages it holds keep their
visibility through the outage (nothing is redelivered), and after recovery every message is
processed exactly once; nothing is lost."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pytest

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State, Transition
from kmq_dagster.core.naming import retry_topic
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.kafka_helpers import new_queue, produce, read_topic, running_service, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2
MESSAGES = 400
OUTAGE_S = 30
#: Far shorter than the outage: held messages survive it only by having their visibility extended.
VISIBILITY_MS = 8_000
RETRY_DELAYS_MS = (2_000, 5_000, 10_000, 20_000, 40_000)
CONFIG = BreakerConfig(
    window_ms=5_000,
    min_calls=10,
    error_rate=0.5,
    consecutive_failures=10,
    cooldown_ms=4_000,
    cooldown_multiplier=2,
    max_cooldown_ms=8_000,
    probes=2,
)


class DownstreamError(RuntimeError):
    pass


def test_an_outage_opens_the_breaker_and_then_nothing_reaches_the_retry_topics(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    queue = new_queue(
        settings, topic_name, partitions=PARTITIONS, retry_delays_ms=RETRY_DELAYS_MS,
        visibility_timeout_ms=VISIBILITY_MS,
    )  # fmt: skip
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    processed: list[bytes] = []  # a list: a message processed twice shows up twice
    failures_ms: list[int] = []
    alerts: list[Transition] = []
    outage_ends_ms = [0]

    def handler(message: KmqMessage) -> None:
        now_ms = wall_clock_ms()
        if now_ms < outage_ends_ms[0]:
            failures_ms.append(now_ms)
            raise DownstreamError("payments API answers 503")
        processed.append(message.value or b"")

    breaker = SharedBreaker(
        CircuitBreaker(CONFIG), queue.queue, store=store, on_transition=alerts.append
    )
    service = Worker(queue, handler, breaker=breaker)
    router = service.router
    stop = threading.Event()
    worker = threading.Thread(target=service.run, args=(stop,))
    with running_service(RedeliveryTracker(queue)) as tracker:
        worker.start()
        try:
            outage_ends_ms[0] = wall_clock_ms() + OUTAGE_S * 1000
            produce(
                settings, topic_name, [str(i).encode() for i in range(MESSAGES)],
                partitions=PARTITIONS,
            )  # fmt: skip
            everything = wait_for(lambda: len(set(processed)) == MESSAGES, timeout_s=OUTAGE_S + 90)
            # every message is acknowledged once the tracker has seen every end marker
            settled = wait_for(lambda: tracker.inflight_count() == 0, timeout_s=30)
        finally:
            stop.set()
            worker.join(60)
    assert everything, f"only {len(set(processed))} of {MESSAGES} processed after the outage"
    assert settled, f"{tracker.inflight_count()} messages never acknowledged"
    duplicates = sorted(v for v, n in collections.Counter(processed).items() if n > 1)
    assert duplicates == [], f"processed more than once: {duplicates[:10]}"
    assert tracker.stats.redelivered == 0, "a held message lost its visibility"
    assert read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, timeout_s=3) == []

    transitions = store.transitions(topic_name, queue.group)
    opened = transitions[0]
    opened_ms = int(opened.at.timestamp() * 1000)
    assert (opened.from_state, opened.to_state) == ("closed", "open")
    assert opened_ms - failures_ms[0] <= CONFIG.window_ms, "did not open within its window"
    assert transitions[-1].to_state == "closed"
    half_opens = [t for t in transitions if t.to_state == "half_open"]
    copies = [
        record
        for name in [*router.retry_topics.values(), queue.queue.dlq_topic]
        for record in read_topic(settings, name, PARTITIONS, timeout_s=5)
    ]
    failed_after_open = [ms for ms in failures_ms if ms > opened_ms]
    print(
        f"{len(failures_ms)} failures: {len(failures_ms) - len(failed_after_open)} until the "
        f"breaker opened, {len(failed_after_open)} failed probes in {len(half_opens)} probe "
        f"rounds; {len(copies)} retry copies; transitions: "
        f"{[(t.from_state, t.to_state, t.reason) for t in transitions]}"
    )
    # Failures until it opened went to the retry topic, except the one that opened it; once
    # open, nothing more did: failed probes wait for recovery instead of spending retries.
    assert len(copies) == len(failures_ms) - len(failed_after_open) - 1
    assert len(copies) < CONFIG.consecutive_failures
    assert max(r.timestamp()[1] for r in copies) <= opened_ms + 1_000  # routed as it opened
    assert read_topic(settings, queue.queue.dlq_topic, PARTITIONS, timeout_s=3) == []
    assert (alerts[0].from_state, alerts[0].to_state) == (State.CLOSED, State.OPEN)
    assert retry_topic(topic_name, queue.group, 2_000) in router.retry_topics.values()
