"""A raw confluent-kafka round trip through the embedded broker: what kmq builds on."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from kmq_dagster.kafka.provision import provision_topic
from kmq_dagster.settings import KmqSettings

pytestmark = pytest.mark.kafka


def _consume(consumer: Consumer, count: int, timeout_s: float = 30) -> list[Message]:
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        received.append(message)
    return received


def test_headers_keys_and_values_survive_the_round_trip(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a topic and a record with binary headers, a null key and a value
    # near the 1,000,000-byte default of message.max.bytes
    provision_topic(settings, topic_name, partitions=1)
    producer = Producer(settings.producer_config())
    big_value = bytes(range(256)) * 3800
    producer.produce(
        topic_name,
        key=None,
        value=big_value,
        headers=[("trace", b"\x00\xff"), ("trace", b"again"), ("empty", b"")],
    )
    producer.produce(topic_name, key=b"k2", value=None)
    assert producer.flush(30) == 0

    # when a consumer reads them
    consumer = Consumer(settings.consumer_config("roundtrip"))
    consumer.subscribe([topic_name])
    try:
        first, second = _consume(consumer, 2)
    finally:
        consumer.close()

    # then keys, values and repeated headers arrive unchanged and in order
    assert first.key() is None
    assert first.value() == big_value
    assert first.headers() == [("trace", b"\x00\xff"), ("trace", b"again"), ("empty", b"")]
    assert second.key() == b"k2"
    assert second.value() is None


def test_a_group_resumes_from_its_committed_offset(settings: KmqSettings, topic_name: str) -> None:
    # given 10 records on two partitions
    provision_topic(settings, topic_name, partitions=2)
    producer = Producer(settings.producer_config())
    for i in range(10):
        producer.produce(topic_name, key=str(i), value=f"v{i}", partition=i % 2)
    assert producer.flush(30) == 0

    # when a group member reads 4 records of partition 0, commits their positions and leaves
    first = Consumer(settings.consumer_config("resume"))
    first.assign([TopicPartition(topic_name, 0, 0)])
    read_first = _consume(first, 4)
    assert [m.offset() for m in read_first] == [0, 1, 2, 3]
    first.commit(offsets=[TopicPartition(topic_name, 0, 4)], asynchronous=False)
    first.close()

    # then a new member of the same group starts exactly after what was committed
    second = Consumer(settings.consumer_config("resume"))
    second.subscribe([topic_name])
    try:
        rest = _consume(second, 6)
        committed = second.committed([TopicPartition(topic_name, 0)], timeout=10)
    finally:
        second.close()
    assert committed[0].offset == 4
    assert sorted((m.partition(), m.offset()) for m in rest) == [
        (0, 4),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
    ]
    assert {m.value() for m in [*read_first, *rest]} == {f"v{i}".encode() for i in range(10)}


def test_two_members_of_a_group_share_the_partitions(
    settings: KmqSettings, topic_name: str
) -> None:
    provision_topic(settings, topic_name, partitions=2)
    consumers = [Consumer(settings.consumer_config("shared")) for _ in range(2)]
    for consumer in consumers:
        consumer.subscribe([topic_name])
    try:
        deadline = time.monotonic() + 30
        assignments: list[list[TopicPartition]] = [[], []]
        while time.monotonic() < deadline:
            for i, consumer in enumerate(consumers):
                consumer.poll(0.2)
                assignments[i] = consumer.assignment()
            if all(len(a) == 1 for a in assignments):
                break
        owned = sorted(tp.partition for a in assignments for tp in a)
    finally:
        for consumer in consumers:
            consumer.close()
    assert owned == [0, 1]
