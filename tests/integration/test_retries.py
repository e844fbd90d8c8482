"""Retries through retry topics, against the real broker: never early, never blocking, isolated."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_TYPE,
    ORIGINAL_TOPIC,
    header_value,
    normalize_headers,
)
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.kafka.consumer import KmqMessage, wall_clock_ms
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.kafka_helpers import (
    new_queue,
    produce,
    read_topic,
    running_service,
    running_worker,
    wait_for,
)

pytestmark = pytest.mark.kafka

DELAY_MS = 2_000


class FlakyError(RuntimeError):
    pass


@dataclass
class Calls:
    """What a test handler saw: (value, wall ms, attempt header, due header) per call."""

    seen: list[tuple[bytes, int, bytes | None, bytes | None]] = field(default_factory=list)

    def values(self) -> list[bytes]:
        return [value for value, *_ in self.seen]


Handler = Callable[[KmqMessage], None]


def recording(fail_when: Callable[[KmqMessage], BaseException | None]) -> tuple[Calls, Handler]:
    calls = Calls()

    def handler(message: KmqMessage) -> None:
        headers = message.headers
        calls.seen.append(
            (message.value or b"", wall_clock_ms(), header_value(headers, ATTEMPT),
             header_value(headers, DUE_MS))
        )  # fmt: skip
        error = fail_when(message)
        if error is not None:
            raise error

    return calls, handler


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, retry_delays_ms=(DELAY_MS,),
                     visibility_timeout_ms=1_000)  # fmt: skip


def test_a_failed_message_comes_back_from_its_retry_topic_when_due_and_not_before(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    produce(settings, queue.topic, [b"flaky"], headers=[("trace", b"\xff")])
    calls, handler = recording(lambda m: FlakyError("once") if len(calls.seen) == 1 else None)
    with running_worker(queue, handler):
        assert wait_for(lambda: len(calls.seen) == 2, timeout_s=60)
    (_, failed_at, first_attempt, _), (_, retried_at, attempt, due) = calls.seen
    assert first_attempt is None
    assert attempt == b"2"
    assert due is not None
    assert retried_at >= int(due)  # never early
    assert retried_at - failed_at >= DELAY_MS
    copies = read_topic(settings, queue.queue.retry_topics[DELAY_MS], 1, at_least=1)
    headers = normalize_headers(copies[0].headers())
    assert header_value(headers, "trace") == b"\xff"
    assert header_value(headers, ERROR_TYPE) == b"FlakyError"


def test_exhausted_and_non_retryable_failures_go_to_the_dlq_with_their_reason(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    produce(settings, queue.topic, [b"always-fails", b"bad-input"])

    def fail(message: KmqMessage) -> BaseException:
        return ValueError("bad") if message.value == b"bad-input" else FlakyError("down")

    calls, handler = recording(fail)
    with running_worker(queue.with_non_retryable(["ValueError"]), handler):
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=2, timeout_s=60)
    reasons = {m.value(): header_value(normalize_headers(m.headers()), DLQ_REASON) for m in dead}
    assert reasons == {
        b"bad-input": b"non-retryable error ValueError",
        b"always-fails": b"failed 2 attempts, the last with FlakyError",
    }
    assert calls.values().count(b"bad-input") == 1  # never retried
    assert calls.values().count(b"always-fails") == 2


def test_corrupt_retry_metadata_goes_to_the_dlq_without_calling_the_handler(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    producer = Producer(settings.producer_config())
    target = queue.queue.retry_topics[DELAY_MS]
    producer.produce(target, value=b"no-headers", partition=0)
    producer.produce(target, value=b"garbage", partition=0, headers=[(ATTEMPT, b"\xff")])
    # and on the queue topic itself, a copy whose origin headers are half there
    producer.produce(
        queue.queue.topic, value=b"half-origin", partition=0,
        headers=[("trace", b"user's"), (ORIGINAL_TOPIC, b"orders")],
    )  # fmt: skip
    assert producer.flush(30) == 0
    calls, handler = recording(lambda m: None)
    with running_worker(queue, handler):
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=3, timeout_s=60)
    assert sorted(m.value() or b"" for m in dead) == [b"garbage", b"half-origin", b"no-headers"]
    for record in dead:
        reason = header_value(normalize_headers(record.headers()), DLQ_REASON) or b""
        assert reason.startswith(b"corrupt retry metadata")
    assert calls.seen == []


def test_a_retry_topic_record_without_headers_alone_in_its_fetch_goes_to_the_dlq(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # (alone: a fetch with no header at all skips the per-message metadata check unless it
    # holds a retry-topic record; above, the other records' headers made the fetch checked)
    producer = Producer(settings.producer_config())
    producer.produce(queue.queue.retry_topics[DELAY_MS], value=b"bare", partition=0)
    assert producer.flush(30) == 0
    calls, handler = recording(lambda m: None)
    with running_worker(queue, handler):
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=1, timeout_s=60)
    assert [m.value() for m in dead] == [b"bare"]
    reason = header_value(normalize_headers(dead[0].headers()), DLQ_REASON) or b""
    assert reason.startswith(b"corrupt retry metadata")
    assert calls.seen == []


def test_a_waiting_retry_does_not_block_new_messages(
    settings: KmqSettings, topic_name: str
) -> None:
    queue = new_queue(settings, topic_name, retry_delays_ms=(10_000,))
    produce(settings, queue.topic, [b"first"])
    calls, handler = recording(lambda m: FlakyError("x") if m.value == b"first" else None)
    with running_worker(queue, handler) as worker:
        assert wait_for(lambda: worker.router.stats.retried == 1)
        produce(settings, queue.topic, [b"second"])
        started = time.monotonic()
        assert wait_for(lambda: b"second" in calls.values(), timeout_s=8)
        assert time.monotonic() - started < 8  # well before the first one's 10 s retry
        assert calls.values() == [b"first", b"second"]


def test_groups_are_isolated_only_the_failing_group_retries(
    settings: KmqSettings, topic_name: str, group: str
) -> None:
    a, b = (
        new_queue(settings, topic_name, f"{group}-{name}", retry_delays_ms=(DELAY_MS,))
        for name in "ab"
    )
    produce(settings, topic_name, [b"m1", b"m2"])
    calls_a, handler_a = recording(lambda m: None)
    calls_b, handler_b = recording(
        lambda m: FlakyError("b only") if len(calls_b.seen) <= 2 else None
    )
    with running_worker(a, handler_a), running_worker(b, handler_b):
        assert wait_for(lambda: len(calls_b.seen) == 4 and len(calls_a.seen) == 2, timeout_s=60)
    assert sorted(calls_a.values()) == [b"m1", b"m2"]  # A saw each message once, no copies
    assert sorted(calls_b.values()) == [b"m1", b"m1", b"m2", b"m2"]
    # and no more can come: A has no copies at all, B exactly its two retries
    assert read_topic(settings, a.queue.retry_topics[DELAY_MS], 1) == []
    assert read_topic(settings, a.queue.redelivery_topic, 1) == []
    assert len(read_topic(settings, b.queue.retry_topics[DELAY_MS], 1, at_least=2)) == 2
    assert read_topic(settings, b.queue.redelivery_topic, 1) == []


def test_keyboard_interrupt_in_a_handler_stops_the_worker_without_losing_the_message(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    produce(settings, queue.topic, [b"interrupted"])
    calls, handler = recording(lambda m: KeyboardInterrupt())
    stats = Worker(queue, handler).run(threading.Event())  # returns: stopped
    assert calls.values() == [b"interrupted"]
    assert stats.handled == 0
    # not acknowledged and not routed: the next worker gets it back
    calls_again, handler_again = recording(lambda m: None)
    with (
        running_service(RedeliveryTracker(queue)),
        running_worker(queue, handler_again),
    ):
        assert wait_for(lambda: calls_again.values() == [b"interrupted"], timeout_s=60)
    assert read_topic(settings, queue.queue.dlq_topic, 1) == []


def test_retries_with_equal_delays_share_one_retry_topic(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a policy that retries twice after the same delay
    queue = new_queue(settings, topic_name, retry_delays_ms=(1_000, 1_000))

    # then the queue has one retry topic, not one per step
    (retry_topic,) = queue.queue.retry_topics.values()
    assert len(queue.queue.group_topics) == 4  # markers, redelivery, one retry topic, DLQ

    # and a message failing twice goes through it twice, then succeeds
    produce(settings, queue.topic, [b"twice"])
    calls, handler = recording(lambda m: FlakyError("down") if len(calls.seen) < 3 else None)
    with running_worker(queue, handler):
        assert wait_for(lambda: len(calls.seen) == 3, timeout_s=60)
    assert [attempt for _, _, attempt, _ in calls.seen] == [None, b"2", b"3"]
    copies = read_topic(settings, retry_topic, 1, at_least=2)
    attempts = sorted(header_value(normalize_headers(c.headers()), ATTEMPT) or b"" for c in copies)
    assert attempts == [b"2", b"3"]
