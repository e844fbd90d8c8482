"""Bounded recovery against the real broker: a restarted tracker resumes from its committed
markers position (the oldest marker still open), redelivers exactly what was left open, and
redelivers nothing from a partition before it has read that partition to its end.

Consumers and trackers share a clock the test moves, so "every deadline has passed" is a fact
set by the test, not a sleep.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from kmq_dagster.core.markers import EndMarker, StartMarker, decode_marker, encode_marker
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker, tracker_group
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import (
    flush_until_tracked,
    new_queue,
    poll_until,
    produce,
    read_topic,
    running_service,
    wait_for,
)
from tests.unit.fakes import FakeClock

pytestmark = pytest.mark.kafka

PARTITIONS = 2
VISIBILITY_MS = 30_000
#: Acknowledgements of other messages between a start marker and its end marker: enough that
#: the tracker runs several redelivery checks (every 0.1 s) while reading them.
PADDING_MARKERS = 100_000


def committed_markers_positions(
    settings: KmqSettings, queue: OpenedQueue, *, partitions: int = PARTITIONS
) -> dict[int, int]:
    """Per markers partition, the offset the trackers of ``queue`` committed."""
    consumer = Consumer(settings.consumer_config(tracker_group(queue.queue)))
    try:
        wanted = [TopicPartition(queue.queue.markers_topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout=10)}
    finally:
        consumer.close()


def oldest_open_marker_offsets(
    markers: list[Message], still_open: set[tuple[int, int]]
) -> dict[int, int]:
    """Per markers partition: the offset of the oldest start marker covering a message of
    ``still_open`` ((partition, offset) pairs), or the partition's end if none is open."""
    latest_start: dict[tuple[int, int], int] = {}
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for record in markers:
        partition, offset = record.partition() or 0, record.offset() or 0
        ends[partition] = max(ends[partition], offset + 1)
        marker = decode_marker(record.value() or b"")
        if isinstance(marker, StartMarker):
            for covered in range(marker.first_offset, marker.first_offset + marker.count):
                latest_start[(marker.partition, covered)] = offset
    oldest = dict(ends)
    for ref in still_open:
        oldest[ref[0]] = min(oldest[ref[0]], latest_start[ref])
    return oldest


def queue_holding(settings: KmqSettings, topic: str, messages: int) -> OpenedQueue:
    """The queue of the test's own group on ``topic`` (:data:`PARTITIONS` partitions,
    visibility :data:`VISIBILITY_MS`), holding the messages ``m0`` to ``m<messages - 1>``."""
    queue = new_queue(settings, topic, partitions=PARTITIONS,
                      visibility_timeout_ms=VISIBILITY_MS)  # fmt: skip
    produce(settings, queue.topic, [f"m{i}".encode() for i in range(messages)],
            partitions=PARTITIONS)  # fmt: skip
    return queue


def test_restarted_tracker_resumes_from_its_commit_and_redelivers_nothing_acknowledged(
    settings: KmqSettings, topic_name: str
) -> None:
    # given 100 messages, every one acknowledged, and a tracker that read all their markers
    queue = queue_holding(settings, topic_name, 100)
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, batch_size=20, clock_ms=clock)
    first = RedeliveryTracker(queue, clock_ms=clock)
    try:
        with running_service(first):
            for message in poll_until(consumer, 100):
                consumer.ack(message)
            written = flush_until_tracked(consumer, first, in_flight=0)
    finally:
        consumer.close()

    # when a new tracker starts after every deadline has passed and reads to the end
    clock.advance(10 * VISIBILITY_MS)
    second = RedeliveryTracker(queue, clock_ms=clock)
    with running_service(second):
        assert wait_for(lambda: second.caught_up_partitions() == [0, 1])

    # then it resumed after every closed marker: nothing read, nothing redelivered
    assert consumer.stats.acked == 100
    assert first.stats.markers == written > 0
    assert second.stats.markers == 0
    assert second.stats.redelivered == 0
    assert read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, timeout_s=3) == []


def test_restarted_tracker_resumes_at_the_oldest_open_marker_and_redelivers_exactly_those(
    settings: KmqSettings, topic_name: str
) -> None:
    # given 60 messages fetched in batches of 10, all acknowledged but three
    queue = queue_holding(settings, topic_name, 60)
    left_open = {b"m21", b"m35", b"m50"}  # offsets 10 and 17 of partition 1, 25 of partition 0
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, batch_size=10, clock_ms=clock)
    first = RedeliveryTracker(queue, clock_ms=clock)
    try:
        with running_service(first):
            messages = poll_until(consumer, 60)
            for message in messages:
                if message.value not in left_open:
                    consumer.ack(message)
            written = flush_until_tracked(consumer, first, in_flight=3)
    finally:
        consumer.close()
    open_refs = {(m.partition, m.offset) for m in messages if m.value in left_open}
    markers = read_topic(settings, queue.queue.markers_topic, PARTITIONS, at_least=written)
    oldest_open = oldest_open_marker_offsets(markers, open_refs)
    ends = {p: 1 + max(r.offset() or 0 for r in markers if r.partition() == p) for p in (0, 1)}

    # then the stopped tracker committed the oldest open marker of each partition, not the start
    assert committed_markers_positions(settings, queue) == oldest_open
    assert all(0 < oldest_open[p] < ends[p] for p in (0, 1))

    # when a new tracker starts exactly at the deadline of the open messages
    clock.advance(VISIBILITY_MS)
    second = RedeliveryTracker(queue, clock_ms=clock)
    with running_service(second):
        assert wait_for(lambda: second.stats.redelivered == 3)
        # from the committed positions to the end, then the end markers of its redeliveries
        resumed_reads = sum(ends[p] - oldest_open[p] for p in (0, 1)) + 3
        assert wait_for(lambda: second.stats.markers >= resumed_reads)

    # then it read nothing before the committed positions, and exactly the three open
    # messages came back, once each
    assert second.stats.markers == resumed_reads
    copies = read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, at_least=3)
    assert sorted(r.value() or b"" for r in copies) == sorted(left_open)
    assert second.stats.redelivered == 3
    assert second.stats.dead_lettered == 0


def test_a_restarted_tracker_redelivers_nothing_on_a_partition_before_it_has_read_it_to_the_end(
    settings: KmqSettings, topic_name: str
) -> None:
    # given two messages in flight, and a tracker that read their start marker and stopped
    queue = new_queue(settings, topic_name, partitions=1,
                      visibility_timeout_ms=VISIBILITY_MS)  # fmt: skip
    produce(settings, queue.topic, [b"acked-late", b"never-acked"])
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, clock_ms=clock)
    first = RedeliveryTracker(queue, clock_ms=clock)
    try:
        with running_service(first):
            acked_late, never_acked = poll_until(consumer, 2)
            consumer.flush()
            assert wait_for(
                lambda: first.caught_up_partitions() == [0] and first.inflight_count() == 2
            )
        # when, while no tracker runs, many other acknowledgements are written and only then
        # the first message is acknowledged
        producer = Producer(settings.producer_config())
        for offset in range(1_000, 1_000 + PADDING_MARKERS):
            padding = encode_marker(EndMarker(queue.topic, 0, offset, 1))
            while True:
                try:
                    producer.produce(queue.queue.markers_topic, value=padding, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(30) == 0
        consumer.ack(acked_late)
        consumer.flush()
    finally:
        consumer.close()

    # and a new tracker starts long after both deadlines
    clock.advance(10 * VISIBILITY_MS)
    second = RedeliveryTracker(queue, clock_ms=clock)
    with running_service(second):
        assert wait_for(lambda: second.stats.redelivered == 1)
        assert second.caught_up_partitions() == [0]

    # then only the message never acknowledged came back: the tracker waited for the late
    # acknowledgement at the end of the partition before redelivering anything
    copies = read_topic(settings, queue.queue.redelivery_topic, 1, at_least=1)
    assert [r.value() for r in copies] == [never_acked.value] == [b"never-acked"]
    assert second.stats.markers >= PADDING_MARKERS + 2
    assert second.stats.redelivered == 1
