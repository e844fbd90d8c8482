"""Idle side partitions are parked at their end and read again every peek interval, never the
queue topic and never one a retry not yet due holds (fake consumer, fake clock)."""

from __future__ import annotations

import math

import pytest
from confluent_kafka import TopicPartition

from kmq_dagster.kafka.idle_parking import IdleParking

QUEUE = "orders"
REDELIVERY = "orders.billing.redelivery"
RETRY = "orders.billing.retry.5s"


class PausingConsumer:
    """What IdleParking does to a confluent-kafka consumer, recorded."""

    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_side_partition_at_its_end_is_parked_until_the_next_peek_and_the_queue_never() -> None:
    # given parking of the redelivery and retry topics, peeking every 0.5 s
    consumer, clock = PausingConsumer(), Clock()
    parking = IdleParking(consumer, [REDELIVERY, RETRY], interval_s=0.5, clock_s=clock)  # type: ignore[arg-type]
    assert parking.until_peek_s() == math.inf  # nothing parked: a fetch may wait as it likes

    # when each topic's partition 0 is read to its end
    for topic in (QUEUE, REDELIVERY, RETRY):
        parking.reached_end((topic, 0))

    # then the side partitions are paused, the queue topic is not
    assert consumer.paused == {(REDELIVERY, 0), (RETRY, 0)}
    assert parking.is_parked((REDELIVERY, 0)) and not parking.is_parked((QUEUE, 0))
    assert parking.until_peek_s() == pytest.approx(0.5)  # a fetch waits no longer than this

    clock.now_s += 0.499  # before the interval: still parked
    parking.peek_if_due(lambda _source: True)
    assert consumer.paused == {(REDELIVERY, 0), (RETRY, 0)}

    clock.now_s += 0.001  # at the interval: every parked partition is read again
    parking.peek_if_due(lambda _source: True)
    assert consumer.paused == set() and not parking.is_parked((RETRY, 0))

    # and one that reaches its end again is parked again, until the next peek
    parking.reached_end((RETRY, 0))
    clock.now_s += 0.25
    parking.peek_if_due(lambda _source: True)
    assert consumer.paused == {(RETRY, 0)}
    clock.now_s += 0.25
    parking.peek_if_due(lambda _source: True)
    assert consumer.paused == set()


def test_a_peek_leaves_a_partition_paused_for_a_retry_not_yet_due_and_forgets_revoked_ones() -> (
    None
):
    consumer, clock = PausingConsumer(), Clock()
    parking = IdleParking(consumer, [REDELIVERY, RETRY], interval_s=0.5, clock_s=clock)  # type: ignore[arg-type]
    parking.reached_end((RETRY, 0))
    parking.reached_end((RETRY, 1))
    parking.reached_end((REDELIVERY, 0))

    # when partition 1 is revoked and a peek comes while (RETRY, 0) waits for a due retry
    parking.forget([(RETRY, 1)])
    clock.now_s += 0.5
    parking.peek_if_due(lambda source: source != (RETRY, 0))

    # then the redelivery partition is read again; the gated one stays as its gate left it
    # (resumed by the gate when due), and none of them is parked any more
    assert (REDELIVERY, 0) not in consumer.paused
    assert (RETRY, 0) in consumer.paused
    assert not any(parking.is_parked((RETRY, p)) for p in (0, 1))
