"""What the consumer writes to the markers topic, against the real broker: deadlines exactly
the consumer's clock plus the timeout, and offsets committed only once a batch's start markers
are durable (a lost start marker makes the batch be fetched again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kmq_dagster.core.markers import StartMarker, decode_marker
from kmq_dagster.core.queue import Queue
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, poll_until, produce, read_topic
from tests.unit.fakes import FakeClock

pytestmark = pytest.mark.kafka

VISIBILITY_MS = 45_000
#: Far from the wall clock, so a deadline taken from the wall clock cannot pass for this one.
FIXED_NOW_MS = 1_700_000_000_000

Report = Callable[[KafkaError | None, Any], None]


class LosingProducer:
    """A real producer that loses the first ``lose`` records given to it: they never reach
    the broker, and their delivery reports say so (a timeout) once :meth:`report_losses`
    was called; until then they are simply unanswered, like a marker still on its way."""

    def __init__(self, producer: Producer, lose: int) -> None:
        self._producer = producer
        self._to_lose = lose
        self._unanswered: list[Report] = []
        self._answer_now = False

    def produce(self, topic: str, **fields: Any) -> None:
        if self._to_lose:
            self._to_lose -= 1
            self._unanswered.append(fields["on_delivery"])
            return
        self._producer.produce(topic, **fields)

    def report_losses(self) -> None:
        """Answer the lost records at the next poll or flush."""
        self._answer_now = True

    def poll(self, timeout: float = 0) -> int:
        self._answer()
        return self._producer.poll(timeout)

    def flush(self, timeout: float = DELIVERY_TIMEOUT_S) -> int:
        self._answer()
        return self._producer.flush(timeout)

    def _answer(self) -> None:
        if self._answer_now:
            answered, self._unanswered = self._unanswered, []
            for report in answered:
                report(KafkaError(KafkaError._MSG_TIMED_OUT), None)


def committed_offset(settings: KmqSettings, queue: Queue) -> int:
    """The group's committed offset of partition 0 of the queue topic (negative: none)."""
    consumer = Consumer(settings.consumer_config(queue.group))
    try:
        (committed,) = consumer.committed([TopicPartition(queue.topic, 0)], timeout=10)
        return int(committed.offset)
    finally:
        consumer.close()


def start_markers(settings: KmqSettings, queue: Queue, at_least: int) -> list[StartMarker]:
    records = read_topic(settings, queue.markers_topic, 1, at_least=at_least)
    markers = [decode_marker(r.value() or b"") for r in records]
    return [m for m in markers if isinstance(m, StartMarker)]


def test_start_extend_and_nack_deadlines_are_the_consumers_clock_plus_the_timeout_exactly(
    settings: KmqSettings, topic_name: str
) -> None:
    queue = new_queue(settings, topic_name, visibility_timeout_ms=VISIBILITY_MS)
    produce(settings, queue.topic, [b"a", b"b", b"c"])
    clock = FakeClock(FIXED_NOW_MS)
    consumer = KmqConsumer(queue, clock_ms=clock)
    try:
        # when three messages are fetched at FIXED_NOW_MS (the clock stands still meanwhile)
        fetched = poll_until(consumer, 3)
        # and, 1,234 ms later, one is extended by 8.5 s and, 1 ms after that, one is nacked
        clock.advance(1_234)
        consumer.extend(fetched[0], 8.5)
        clock.advance(1)
        consumer.nack(fetched[1])
        consumer.flush()
    finally:
        consumer.close()

    # then every deadline is the consumer's clock plus the timeout, to the millisecond
    starts = start_markers(settings, queue.queue, at_least=3)
    fetch_markers, extended, nacked = starts[:-2], starts[-2], starts[-1]
    assert [m.offset for m in fetched] == [0, 1, 2]
    assert sum(m.count for m in fetch_markers) == 3
    assert {m.deadline_ms for m in fetch_markers} == {FIXED_NOW_MS + VISIBILITY_MS}
    assert extended == StartMarker(queue.topic, 0, 0, 1, FIXED_NOW_MS + 1_234 + 8_500)
    assert nacked == StartMarker(queue.topic, 0, 1, 1, FIXED_NOW_MS + 1_235)


def test_a_lost_start_marker_keeps_the_offsets_uncommitted_and_the_batch_is_fetched_again(
    settings: KmqSettings, topic_name: str
) -> None:
    # given five messages, and a consumer whose first start marker will be lost
    queue = new_queue(settings, topic_name)
    produce(settings, queue.topic, [f"m{i}".encode() for i in range(5)])
    losing = LosingProducer(Producer(settings.producer_config()), lose=1)
    consumer = KmqConsumer(queue, producer=losing)  # type: ignore[arg-type]
    try:
        first = consumer.poll(timeout_s=30)
        assert [m.offset for m in first] == [0, 1, 2, 3, 4]

        # when the marker is still unanswered: nothing is committed
        consumer.flush()
        unanswered_commit = committed_offset(settings, queue.queue)
        # when the broker reports it lost: still nothing is committed, and the batch comes back
        losing.report_losses()
        consumer.flush()
        lost_commit = committed_offset(settings, queue.queue)
        again = poll_until(consumer, 5)
        # once the second start marker is durable, the offsets are committed
        consumer.flush()
        durable_commit = committed_offset(settings, queue.queue)
    finally:
        consumer.close()

    assert unanswered_commit < 0
    assert lost_commit < 0
    assert consumer.stats.marker_write_failures == 1
    assert [(m.offset, m.value) for m in again] == [(m.offset, m.value) for m in first]
    assert all(m.topic == queue.topic and m.redelivery_count == 0 for m in again)
    assert durable_commit == 5
    (written,) = start_markers(settings, queue.queue, at_least=1)
    assert (written.first_offset, written.count) == (0, 5)
