"""Counting a topic's records, by reading it to its end (partition EOF, never ListOffsets)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kmq_dagster.kafka.clients import CLIENT_LOGGER
from kmq_dagster.settings import KmqSettings


def count_records(
    settings: KmqSettings, topic: str, partitions: int, timeout_s: float = 60.0
) -> int:
    """How many records ``topic`` holds now (read from the start, without a group).

    Raises:
        TimeoutError: not every partition reached its end in time.
    """
    consumer = Consumer(
        settings.consumer_config(
            f"kmq-count-{uuid.uuid4().hex}",
            **{"enable.partition.eof": True, "logger": CLIENT_LOGGER},
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    count = 0
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end in {timeout_s:.0f} s")
            for record in consumer.consume(1_000, 0.5):
                error = record.error()
                if error is None:
                    count += 1
                    at_end.discard(record.partition() or 0)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(record.partition() or 0)
                elif error.fatal():
                    raise KafkaException(error)
    finally:
        consumer.close()
    return count
