"""Retries through retry topics, against the real broker: never early, never blocking, isolated."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from kmq_dagster.core.headers import DLQ_REASON, ERROR_TYPE, header_value, normalize_headers
from kmq_dagster.core.naming import dlq_topic, retry_topic
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage, wall_clock_ms
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.kafka.tracker import Tracker
from kmq_dagster.kafka.worker import run_worker
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import produce, read_topic, running_service, running_worker, wait_for

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
def queue(settings: KmqSettings, topic_name: str) -> str:
    provision_queue(settings, topic_name, partitions=1, group="g", retry_delays_ms=(DELAY_MS,))
    return topic_name


def test_a_failed_message_comes_back_from_its_retry_topic_when_due_and_not_before(
    settings: KmqSettings, queue: str
) -> None:
    produce(settings, queue, [b"flaky"], headers=[("trace", b"\xff")])
    calls, handler = recording(lambda m: FlakyError("once") if len(calls.seen) == 1 else None)
    with running_worker(settings, queue, "g", handler, RetryPolicy.fixed([DELAY_MS])):
        assert wait_for(lambda: len(calls.seen) == 2, timeout_s=60)
    (_, failed_at, first_attempt, _), (_, retried_at, attempt, due) = calls.seen
    assert first_attempt is None
    assert attempt == b"2"
    assert due is not None
    assert retried_at >= int(due)  # never early
    assert retried_at - failed_at >= DELAY_MS
    copies = read_topic(settings, retry_topic(queue, "g", DELAY_MS), 1, at_least=1)
    headers = normalize_headers(copies[0].headers())
    assert header_value(headers, "trace") == b"\xff"
    assert header_value(headers, ERROR_TYPE) == b"FlakyError"


def test_exhausted_and_non_retryable_failures_go_to_the_dlq_with_their_reason(
    settings: KmqSettings, queue: str
) -> None:
    produce(settings, queue, [b"always-fails", b"bad-input"])

    def fail(message: KmqMessage) -> BaseException:
        return ValueError("bad") if message.value == b"bad-input" else FlakyError("down")

    calls, handler = recording(fail)
    policy = RetryPolicy.fixed([DELAY_MS], non_retryable=["ValueError"])
    with running_worker(settings, queue, "g", handler, policy):
        dead = read_topic(settings, dlq_topic(queue, "g"), 1, at_least=2, timeout_s=60)
    reasons = {m.value(): header_value(normalize_headers(m.headers()), DLQ_REASON) for m in dead}
    assert reasons == {
        b"bad-input": b"non-retryable error ValueError",
        b"always-fails": b"failed 2 attempts, the last with FlakyError",
    }
    assert calls.values().count(b"bad-input") == 1  # never retried
    assert calls.values().count(b"always-fails") == 2


def test_corrupt_retry_metadata_goes_to_the_dlq_without_calling_the_handler(
    settings: KmqSettings, queue: str
) -> None:
    producer = Producer(settings.producer_config())
    target = retry_topic(queue, "g", DELAY_MS)
    producer.produce(target, value=b"no-headers", partition=0)
    producer.produce(target, value=b"garbage", partition=0, headers=[(ATTEMPT, b"\xff")])
    assert producer.flush(30) == 0
    calls, handler = recording(lambda m: None)
    with running_worker(settings, queue, "g", handler, RetryPolicy.fixed([DELAY_MS])):
        dead = read_topic(settings, dlq_topic(queue, "g"), 1, at_least=2, timeout_s=60)
    assert sorted(m.value() or b"" for m in dead) == [b"garbage", b"no-headers"]
    for record in dead:
        reason = header_value(normalize_headers(record.headers()), DLQ_REASON) or b""
        assert reason.startswith(b"corrupt retry metadata")
    assert calls.seen == []


def test_a_waiting_retry_does_not_block_new_messages(settings: KmqSettings, queue: str) -> None:
    provision_queue(settings, queue, group="g", retry_delays_ms=(10_000,))
    produce(settings, queue, [b"first"])
    calls, handler = recording(lambda m: FlakyError("x") if m.value == b"first" else None)
    with running_worker(settings, queue, "g", handler, RetryPolicy.fixed([10_000])) as router:
        assert wait_for(lambda: router.stats.retried == 1)
        produce(settings, queue, [b"second"])
        started = time.monotonic()
        assert wait_for(lambda: b"second" in calls.values(), timeout_s=8)
        assert time.monotonic() - started < 8  # well before the first one's 10 s retry
        assert calls.values() == [b"first", b"second"]


def test_groups_are_isolated_only_the_failing_group_retries(
    settings: KmqSettings, topic_name: str
) -> None:
    for group in ("a", "b"):
        provision_queue(
            settings, topic_name, partitions=1, group=group, retry_delays_ms=(DELAY_MS,)
        )
    produce(settings, topic_name, [b"m1", b"m2"])
    calls_a, handler_a = recording(lambda m: None)
    calls_b, handler_b = recording(
        lambda m: FlakyError("b only") if len(calls_b.seen) <= 2 else None
    )
    policy = RetryPolicy.fixed([DELAY_MS])
    with (
        running_worker(settings, topic_name, "a", handler_a, policy),
        running_worker(settings, topic_name, "b", handler_b, policy),
    ):
        assert wait_for(lambda: len(calls_b.seen) == 4, timeout_s=60)
        time.sleep(1)
    assert sorted(calls_a.values()) == [b"m1", b"m2"]  # A saw each message once, no copies
    assert sorted(calls_b.values()) == [b"m1", b"m1", b"m2", b"m2"]
    assert read_topic(settings, retry_topic(topic_name, "a", DELAY_MS), 1) == []
    assert len(read_topic(settings, retry_topic(topic_name, "b", DELAY_MS), 1, at_least=2)) == 2


def test_keyboard_interrupt_in_a_handler_stops_the_worker_without_losing_the_message(
    settings: KmqSettings, queue: str
) -> None:
    produce(settings, queue, [b"interrupted"])
    calls, handler = recording(lambda m: KeyboardInterrupt())
    router = RetryRouter(
        settings, queue, "g", RetryPolicy.fixed([DELAY_MS]), clock_ms=wall_clock_ms
    )
    consumer = KmqConsumer(settings, queue, "g", visibility_timeout_ms=1_000)
    stats = run_worker(consumer, handler, threading.Event(), router=router)  # returns: stopped
    assert calls.values() == [b"interrupted"]
    assert stats.handled == 0
    # not acknowledged and not routed: the next worker gets it back
    calls_again, handler_again = recording(lambda m: None)
    with (
        running_service(Tracker(settings, queue, "g")),
        running_worker(settings, queue, "g", handler_again, RetryPolicy.fixed([DELAY_MS])),
    ):
        assert wait_for(lambda: calls_again.values() == [b"interrupted"], timeout_s=60)
    assert read_topic(settings, dlq_topic(queue, "g"), 1) == []
