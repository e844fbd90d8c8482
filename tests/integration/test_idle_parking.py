"""A consumer parks its queue's empty redelivery and retry partitions and reads them again every
peek interval: what arrives on them while parked is still fetched, every message of it, and the
queue topic is never parked (real broker)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.idle_parking import PEEK_INTERVAL_S
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce, wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 2
BURSTS = 4
PER_TOPIC = 20


@pytest.fixture
def opened(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, partitions=PARTITIONS)


@pytest.fixture
def consumer(opened: OpenedQueue) -> Iterator[KmqConsumer]:
    made = KmqConsumer(opened)
    yield made
    made.close()


def _side_partitions_parked(consumer: KmqConsumer, side: list[tuple[str, int]]) -> bool:
    consumer.poll(timeout_s=0.05)  # parking and peeks happen in the consumer's fetches
    return all(consumer._parking.is_parked(source) for source in side)


def test_messages_arriving_on_parked_side_partitions_are_all_fetched(
    settings: KmqSettings, opened: OpenedQueue, consumer: KmqConsumer
) -> None:
    queue = opened.queue
    side_topics = [queue.redelivery_topic, *queue.retry_topics.values()]
    assert wait_for(lambda: not consumer.poll(0.05) and consumer.assignment_ready(), 60), (
        "never assigned"
    )
    side = [s for s in consumer.assigned_partitions() if s[0] in side_topics]
    assert {topic for topic, _ in side} == set(side_topics)

    received: list[bytes] = []
    sent: list[bytes] = []
    for burst in range(BURSTS):
        # given every side partition parked: read to its end, with nothing on it
        assert wait_for(lambda: _side_partitions_parked(consumer, side), timeout_s=60), (
            f"burst {burst}: side partitions never parked"
        )
        # (the queue topic, read to its end as well, is not)
        assert not any(consumer._parking.is_parked((queue.topic, p)) for p in range(PARTITIONS))
        # when messages arrive on every side topic and on the queue topic while they are parked
        for topic in [queue.topic, *side_topics]:
            values = [f"{topic}/{burst}/{i}".encode() for i in range(PER_TOPIC)]
            partitions = len([s for s in consumer.assigned_partitions() if s[0] == topic])
            produce(settings, topic, values, partitions=partitions)
            sent += values
        # then every one of them is fetched (the parked ones at a peek), and acknowledged
        deadline = time.monotonic() + 60
        while len(received) < len(sent) and time.monotonic() < deadline:
            for message in consumer.poll(timeout_s=PEEK_INTERVAL_S):
                received.append(message.value or b"")
                consumer.ack(message)
        assert sorted(received) == sorted(sent), f"burst {burst}: missing or doubled"


def test_a_long_poll_still_peeks_at_parked_partitions(
    settings: KmqSettings, opened: OpenedQueue, consumer: KmqConsumer
) -> None:
    # given an idle queue whose redelivery partition is parked
    redelivery = opened.queue.redelivery_topic
    assert wait_for(lambda: not consumer.poll(0.05) and consumer.assignment_ready(), 60)
    side = [s for s in consumer.assigned_partitions() if s[0] == redelivery]
    assert wait_for(lambda: _side_partitions_parked(consumer, side), timeout_s=60)

    # when a redelivered message arrives and the user's poll may wait up to 60 s for one
    produce(settings, redelivery, [b"late"], partitions=1)
    began = time.monotonic()
    fetched = consumer.poll(timeout_s=60)

    # then the poll hands it out at a peek, not at the end of its wait
    assert [m.value for m in fetched] == [b"late"]
    assert time.monotonic() - began < 30
    consumer.ack(fetched[0])
