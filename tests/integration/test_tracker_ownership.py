"""Which markers partitions a tracker owns, against the real broker. A tracker that finds its
group empty starts on every markers partition before the group has formed: it redelivers at
once, keeps what it read when the group gives it its share, and commits its positions however
early it stops; a tracker that finds a member in the group waits for its share instead. A
rebalance that gives a tracker back partitions it had keeps what it read of them.

The embedded broker forms a new group after half the session timeout; the trackers here that
must still be early when the test looks get a long one (:data:`SLOW_JOIN_SESSION_MS`), so "the
group has not formed yet" holds by a margin of seconds, not by luck.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from tests.integration.test_tracker_recovery import committed_markers_positions
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

pytestmark = [
    pytest.mark.kafka,
    # librdkafka's mock cluster answers no group description: a tracker there always joins
    # first, which the other tracker tests cover.
    pytest.mark.embedded_broker_only,
]

VISIBILITY_MS = 30_000
#: The embedded broker forms a new group after 10 s with it.
SLOW_JOIN_SESSION_MS = 20_000


def slow_to_join(queue: OpenedQueue) -> OpenedQueue:
    """``queue`` opened with settings whose group joins take :data:`SLOW_JOIN_SESSION_MS` / 2."""
    slow = dataclasses.replace(queue.settings, session_timeout_ms=SLOW_JOIN_SESSION_MS)
    return dataclasses.replace(queue, settings=slow)


def test_a_tracker_in_an_empty_group_redelivers_before_the_group_forms_and_keeps_what_it_read(
    settings: KmqSettings, topic_name: str
) -> None:
    # given two messages on two partitions, one acknowledged, one left open past its deadline
    queue = new_queue(settings, topic_name, partitions=2, visibility_timeout_ms=VISIBILITY_MS)
    produce(settings, queue.topic, [b"acked", b"left-open"], partitions=2)
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, clock_ms=clock)
    try:
        received = poll_until(consumer, 2)
        consumer.ack(next(m for m in received if m.value == b"acked"))
        consumer.flush()
    finally:
        consumer.close()
    clock.advance(VISIBILITY_MS)

    # when a tracker starts in its (empty) group
    tracker = RedeliveryTracker(slow_to_join(queue), clock_ms=clock)
    with running_service(tracker):
        # then it redelivers the open message while the group has not formed
        assert wait_for(lambda: tracker.stats.redelivered == 1)
        assert tracker.started_early
        assert tracker.tracking_early
        assert tracker.owned_partitions() == [0, 1]
        # and when the group has given it its share, it owns the same partitions, caught up
        assert wait_for(lambda: not tracker.tracking_early, timeout_s=60)
        assert tracker.owned_partitions() == [0, 1]
        assert tracker.caught_up_partitions() == [0, 1]

    # and it never read a marker twice: the share kept what it had read early
    markers = read_topic(settings, queue.queue.markers_topic, 2, at_least=tracker.stats.markers)
    assert tracker.stats.markers == len(markers)
    copies = read_topic(settings, queue.queue.redelivery_topic, 2, at_least=1)
    assert [r.value() for r in copies] == [b"left-open"]
    assert tracker.stats.redelivered == 1


def test_a_tracker_stopped_before_its_group_formed_commits_its_positions(
    settings: KmqSettings, topic_name: str
) -> None:
    # given 20 acknowledged messages, and a tracker that read their markers in its first
    # seconds, before its group formed
    queue = new_queue(settings, topic_name, partitions=1, visibility_timeout_ms=VISIBILITY_MS)
    produce(settings, queue.topic, [f"m{i}".encode() for i in range(20)])
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, batch_size=5, clock_ms=clock)
    first = RedeliveryTracker(slow_to_join(queue), clock_ms=clock)
    try:
        with running_service(first):
            for message in poll_until(consumer, 20):
                consumer.ack(message)
            written = flush_until_tracked(consumer, first, in_flight=0)
            # when it is stopped while still early
            assert first.tracking_early
    finally:
        consumer.close()

    # then its position, the end of the markers partition, was committed
    assert committed_markers_positions(settings, queue, partitions=1) == {0: written}
    # and a tracker started after every deadline reads and redelivers nothing
    clock.advance(10 * VISIBILITY_MS)
    second = RedeliveryTracker(queue, clock_ms=clock)
    with running_service(second):
        assert wait_for(lambda: second.caught_up_partitions() == [0])
    assert second.stats.markers == 0
    assert second.stats.redelivered == 0


def test_a_tracker_that_finds_a_member_in_its_group_waits_for_its_share(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a tracker that owns both markers partitions as the group's member
    queue = new_queue(settings, topic_name, partitions=2, visibility_timeout_ms=VISIBILITY_MS)
    first = RedeliveryTracker(queue)
    with running_service(first):
        assert wait_for(lambda: not first.tracking_early and first.owned_partitions() == [0, 1])

        # when a second tracker starts
        second = RedeliveryTracker(queue)
        with running_service(second):
            # then it takes nothing early; the group shares the partitions out
            assert wait_for(
                lambda: len(first.owned_partitions()) == len(second.owned_partitions()) == 1,
                timeout_s=60,
            )
            assert not second.started_early
            assert sorted(first.owned_partitions() + second.owned_partitions()) == [0, 1]


def test_two_trackers_starting_together_in_an_empty_group_lose_nothing(
    settings: KmqSettings, topic_name: str
) -> None:
    # given six messages on two partitions, none acknowledged, every deadline passed
    queue = new_queue(settings, topic_name, partitions=2, visibility_timeout_ms=VISIBILITY_MS)
    values = [f"m{i}".encode() for i in range(6)]
    produce(settings, queue.topic, values, partitions=2)
    clock = FakeClock(wall_clock_ms())
    consumer = KmqConsumer(queue, clock_ms=clock)
    try:
        assert len(poll_until(consumer, 6)) == 6
        consumer.flush()
    finally:
        consumer.close()
    clock.advance(VISIBILITY_MS)

    # when two trackers start at once: both may find the group empty and start early (both
    # did, run alone on a quiet machine), or one may find the other joining and wait
    first = RedeliveryTracker(queue, clock_ms=clock)
    second = RedeliveryTracker(queue, clock_ms=clock)
    with running_service(first), running_service(second):
        # then once the group has formed they own the partitions apart
        assert wait_for(
            lambda: (
                not first.tracking_early
                and not second.tracking_early
                and sorted(first.owned_partitions() + second.owned_partitions()) == [0, 1]
            ),
            timeout_s=60,
        )
        assert wait_for(lambda: first.stats.redelivered + second.stats.redelivered >= 6)

    # and every message came back at least once (twice only if both redelivered it early)
    redelivered = first.stats.redelivered + second.stats.redelivered
    copies = read_topic(settings, queue.queue.redelivery_topic, 2, at_least=redelivered)
    assert {r.value() for r in copies} == set(values)
    assert len(copies) == redelivered <= 12


def test_a_rebalance_keeps_what_a_tracker_read_of_the_partitions_it_gives_back(
    settings: KmqSettings, topic_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kmq_dagster.kafka.redelivery_tracker")
    # given a tracker owning both markers partitions, one message left open on each
    queue = new_queue(settings, topic_name, partitions=2, visibility_timeout_ms=VISIBILITY_MS)
    produce(settings, queue.topic, [f"m{i}".encode() for i in range(20)], partitions=2)
    consumer = KmqConsumer(queue, batch_size=5)
    first = RedeliveryTracker(queue)
    try:
        with running_service(first):
            received = poll_until(consumer, 20)
            left_open = {(p, min(m.offset for m in received if m.partition == p)) for p in (0, 1)}
            for message in received:
                if (message.partition, message.offset) not in left_open:
                    consumer.ack(message)
            written = flush_until_tracked(consumer, first, in_flight=2)
            assert wait_for(lambda: not first.tracking_early, timeout_s=60)

            # when a second tracker joins and the group shares the partitions out
            second = RedeliveryTracker(queue)
            with running_service(second):
                assert wait_for(
                    lambda: (
                        len(first.caught_up_partitions()) == 1
                        and len(second.caught_up_partitions()) == 1
                    ),
                    timeout_s=60,
                )
                kept = first.owned_partitions()

                # then the first read nothing again (its committed position is the open
                # message's start marker: the kept partition read afresh repeats markers)
                assert first.stats.markers == written
                assert first.inflight_count() == 1
                assert second.owned_partitions() == [1 - kept[0]]
                # but it read the kept partition to its end again before redelivering from
                # it (the other tracker might have owned it meanwhile)
                caught_up = [
                    r for r in caplog.records
                    if r.name.endswith("redelivery_tracker") and "caught up" in r.getMessage()
                    and f"partition {kept[0]} " in r.getMessage()
                ]  # fmt: skip
                assert len(caught_up) == 2
    finally:
        consumer.close()
