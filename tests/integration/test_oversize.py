"""Messages too large to copy: dead-lettered as references, never a crash (issue 34, item 2).

kmq's copy producers are given a 1 MB ``message.max.bytes`` here and the messages are 2 MB, so
every retry, redelivery or DLQ copy is refused for its size (MSG_SIZE_TOO_LARGE), as a broker
with a smaller limit than the sender's refuses it on a real cluster. The embedded broker has no
size limit of its own (BROKER.md), so the client's limit stands in for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Message, Producer

from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_TYPE,
    ORIGINAL_OFFSET,
    Headers,
    header_value,
    normalize_headers,
)
from kmq_dagster.core.markers import EndMarker, decode_marker
from kmq_dagster.core.oversize import OVERSIZE_BYTES, VALUE_REF
from kmq_dagster.core.replay_request import ReplayRequest
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.errors import DeliveryError, ReferenceUnresolvedError
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.operations.replay import replay_dead_letters
from kmq_dagster.schemas.wire import UndecodableValue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.kafka_helpers import new_queue, produce, read_topic, wait_for

pytestmark = pytest.mark.kafka

#: kmq's copy producers' limit in these tests (``-X message.max.bytes``).
LIMIT_BYTES = 1_000_000
#: A message over it: 2,048,000 bytes of every byte value, so a copy is checked byte for byte.
BIG = bytes(range(256)) * 8_000
RETRY_DELAY_MS = 60_000


def limited(settings: KmqSettings, limit_bytes: int = LIMIT_BYTES) -> KmqSettings:
    return settings.with_overrides(client_config={"message.max.bytes": str(limit_bytes)})


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, retry_delays_ms=(RETRY_DELAY_MS,),
                     visibility_timeout_ms=1_000)  # fmt: skip


def with_settings(queue: OpenedQueue, settings: KmqSettings) -> OpenedQueue:
    """The same provisioned queue, reached with other client settings."""
    return vouch_for(settings, queue.queue)


@contextmanager
def running(run: Callable[[threading.Event], object]) -> Iterator[Callable[[], None]]:
    """Run ``run(stop)`` on a thread; yields a check that it is still running (it raised
    nothing), which the block calls after its waits and which is checked again at the end."""
    stop = threading.Event()
    crashed: list[BaseException] = []

    def target() -> None:
        try:
            run(stop)
        except BaseException as exc:
            crashed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def alive() -> None:
        assert not crashed, f"crashed: {crashed[0]!r}"
        assert thread.is_alive()

    try:
        yield alive
        alive()
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "did not stop"
    assert not crashed, f"crashed: {crashed[0]!r}"


def headers_of(record: Message) -> Headers:
    return normalize_headers(record.headers())


def text(headers: Headers, name: str) -> str:
    return (header_value(headers, name) or b"").decode()


def ended_offsets(settings: KmqSettings, queue: OpenedQueue) -> set[int]:
    """Offsets of the queue topic's partition 0 that an end marker acknowledged."""
    ended: set[int] = set()
    for record in read_topic(settings, queue.queue.markers_topic, 1, at_least=1):
        marker = decode_marker(record.value() or b"")
        if isinstance(marker, EndMarker) and marker.topic == queue.topic:
            ended.update(range(marker.first_offset, marker.first_offset + marker.count))
    return ended


def assert_reference(record: Message, queue: OpenedQueue, offset: int, refused_for: str) -> None:
    headers = headers_of(record)
    assert record.value() == b""
    assert text(headers, VALUE_REF) == f"{queue.topic}/0/{offset}"
    assert int(text(headers, OVERSIZE_BYTES)) >= len(BIG)
    reason = text(headers, DLQ_REASON)
    assert "too large to copy" in reason and f"refused for {refused_for}" in reason
    assert f"reference to {queue.topic} [0] @ {offset}" in reason


def test_a_worker_dead_letters_a_reference_for_a_failed_message_too_large_to_retry(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a 2 MB message and a small one, a handler that fails both, and a 1 MB copy limit
    produce(settings, queue.topic, [BIG, b"small"])

    def handler(_message: KmqMessage) -> None:
        raise ValueError("rejected")

    worker = Worker(with_settings(queue, limited(settings)), handler)
    with running(worker.run) as alive:
        # then the big one is on the DLQ as a reference, the small one on its retry topic
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=1, timeout_s=20)
        retried = read_topic(settings, queue.queue.retry_topics[RETRY_DELAY_MS], 1, at_least=1)
        # and both were acknowledged, and the worker goes on
        assert wait_for(lambda: ended_offsets(settings, queue) >= {0, 1}, timeout_s=20)
        alive()
    assert len(dead) == 1
    assert_reference(dead[0], queue, 0, queue.queue.retry_topics[RETRY_DELAY_MS])
    headers = headers_of(dead[0])
    assert text(headers, ERROR_TYPE) == "ValueError"
    assert text(headers, ORIGINAL_OFFSET) == "0"
    assert [r.value() for r in retried] == [b"small"]
    assert worker.router.stats.oversize == 1


def test_a_worker_dead_letters_a_reference_for_a_message_too_large_for_the_dlq_itself(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a 2 MB message a handler fails fatally (no retry: straight to the DLQ), 1 MB limit
    produce(settings, queue.topic, [BIG])

    def handler(_message: KmqMessage) -> None:
        raise UndecodableValue("not in the queue's declared format")

    worker = Worker(with_settings(queue, limited(settings)), handler)
    with running(worker.run) as alive:
        # then the DLQ holds a reference in its place, and the message is acknowledged
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=1, timeout_s=20)
        assert wait_for(lambda: ended_offsets(settings, queue) >= {0}, timeout_s=20)
        alive()
    assert len(dead) == 1
    assert_reference(dead[0], queue, 0, queue.queue.dlq_topic)
    assert text(headers_of(dead[0]), ERROR_TYPE) == "UndecodableValue"
    assert read_topic(settings, queue.queue.retry_topics[RETRY_DELAY_MS], 1, timeout_s=2) == []


def test_a_message_whose_reference_cannot_be_written_stays_unacknowledged(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a failing message whose key alone is over the copy limit (so even its reference,
    # which keeps the key, is refused), then an ordinary message
    producer = Producer(settings.producer_config())
    producer.produce(queue.topic, key=b"k" * (LIMIT_BYTES + 1), value=b"v", partition=0)
    producer.produce(queue.topic, key=b"ok", value=b"fine", partition=0)
    assert producer.flush(30) == 0

    def handler(message: KmqMessage) -> None:
        if message.offset == 0:
            raise ValueError("rejected")

    worker = Worker(with_settings(queue, limited(settings)), handler)
    with running(worker.run) as alive:
        assert wait_for(lambda: worker.router.stats.oversize >= 1, timeout_s=20)
        assert wait_for(lambda: 1 in ended_offsets(settings, queue), timeout_s=20)
        alive()
    # then it was never acknowledged (the tracker redelivers it): nothing is acked before its
    # copy or reference is durable; and no dead letter claims it
    assert 0 not in ended_offsets(settings, queue)
    assert read_topic(settings, queue.queue.dlq_topic, 1, timeout_s=5) == []


def leave_unacknowledged(queue: OpenedQueue) -> None:
    """Hand the queue's first message out (its start marker written) and never ack it."""
    consumer = KmqConsumer(queue)
    try:
        assert wait_for(lambda: consumer.poll(timeout_s=0.5), timeout_s=20)
    finally:
        consumer.close()


def test_a_tracker_dead_letters_a_reference_for_an_overdue_message_too_large_to_redeliver(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a 2 MB message handed out and never acknowledged, and a 1 MB copy limit
    produce(settings, queue.topic, [BIG])
    leave_unacknowledged(queue)
    tracker = RedeliveryTracker(with_settings(queue, limited(settings)))
    with running(tracker.run) as alive:
        # then its visibility timeout passes, the tracker dead-letters a reference and ends it
        dead = read_topic(settings, queue.queue.dlq_topic, 1, at_least=1, timeout_s=20)
        assert wait_for(lambda: 0 in ended_offsets(settings, queue), timeout_s=20)
        alive()
    assert len(dead) == 1
    assert_reference(dead[0], queue, 0, queue.queue.redelivery_topic)
    assert tracker.stats.oversize == 1 and tracker.stats.dead_lettered == 1
    assert tracker.stats.redelivered == 0
    assert read_topic(settings, queue.queue.redelivery_topic, 1, timeout_s=5) == []


def test_a_tracker_given_a_larger_message_max_bytes_starts_and_redelivers_the_message_whole(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a 2 MB message never acknowledged, and the limits raised to 3 MB with -X
    produce(settings, queue.topic, [BIG])
    leave_unacknowledged(queue)
    # when a tracker starts with them (its consumers' fetch bounds follow message.max.bytes)
    tracker = RedeliveryTracker(with_settings(queue, limited(settings, 3_000_000)))
    with running(tracker.run) as alive:
        copies = read_topic(settings, queue.queue.redelivery_topic, 1, at_least=1, timeout_s=20)
        alive()
    # then the message is redelivered byte for byte
    assert [record.value() for record in copies] == [BIG]
    assert tracker.stats.oversize == 0


def dead_letter_a_reference(settings: KmqSettings, queue: OpenedQueue) -> None:
    """Route the queue's first record (2 MB) to the DLQ through a 1 MB router: a reference."""
    (record,) = read_topic(settings, queue.topic, 1, at_least=1)
    router = RetryRouter(with_settings(queue, limited(settings)), clock_ms=lambda: 0)
    try:
        routed = router.route([(KmqMessage(record), Failure("ValueError", "rejected"))])
    finally:
        router.close()
    assert len(routed) == 1 and router.stats.oversize == 1


def test_replaying_a_reference_copies_the_original_bytes_from_the_queue_topic(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a reference dead letter for a 2 MB message still in the queue topic
    produce(settings, queue.topic, [BIG])
    dead_letter_a_reference(settings, queue)
    # when it is replayed to the group (kmq's default limit, 16 MB, lets the copy through)
    report = replay_dead_letters(queue, ReplayRequest())
    # then the copy carries the original value byte for byte, and is no reference
    assert report.replayed == 1
    (copy,) = read_topic(settings, queue.queue.redelivery_topic, 1, at_least=1)
    assert copy.value() == BIG
    assert header_value(headers_of(copy), VALUE_REF) is None
    assert header_value(headers_of(copy), OVERSIZE_BYTES) is None


def test_a_reference_to_another_queues_topic_is_not_replayed_and_says_why(
    settings: KmqSettings, queue: OpenedQueue, topic_name: str
) -> None:
    # given a forged reference pointing at a topic that is not this queue's
    other = new_queue(settings, f"{topic_name}-other", queue.group)
    produce(settings, other.topic, [b"secret"])
    producer = Producer(settings.producer_config())
    forged: list[tuple[str, str | bytes | None]] = [
        (VALUE_REF, f"{other.topic}/0/0"),
        (OVERSIZE_BYTES, "6"),
    ]
    producer.produce(queue.queue.dlq_topic, value=b"", partition=0, headers=forged)
    assert producer.flush(30) == 0
    # when it is replayed, then the replay stops with the reason, before any copy
    with pytest.raises(ReferenceUnresolvedError, match="not a topic of"):
        replay_dead_letters(queue, ReplayRequest())
    assert read_topic(settings, queue.queue.redelivery_topic, 1, timeout_s=5) == []


def test_a_replay_whose_copy_is_over_the_limit_stops_before_any_effect_and_says_why(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    # given a reference dead letter for a 2 MB message, replayed with a 1 MB producer limit
    produce(settings, queue.topic, [BIG])
    dead_letter_a_reference(settings, queue)
    with pytest.raises(DeliveryError, match=r"over the producer's limit .*-X message.max.bytes"):
        replay_dead_letters(with_settings(queue, limited(settings)), ReplayRequest())
    # then nothing was sent, so the rerun with a larger limit has no possible duplicates
    report = replay_dead_letters(queue, ReplayRequest())
    assert (report.replayed, report.possible_duplicates) == (1, 0)
