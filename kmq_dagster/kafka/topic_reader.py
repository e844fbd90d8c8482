"""Reading partitions to their end: partition EOF events, never ListOffsets."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kmq_dagster.kafka.clients import CLIENT_LOGGER
from kmq_dagster.settings import KmqSettings


def records_and_ends(
    fetched: list[Message],
    at_end: set[int],
    on_error: Callable[[KafkaError], None] | None = None,
) -> list[Message]:
    """The records among ``fetched`` (from a consumer with ``enable.partition.eof``).

    A partition that reports its end is added to ``at_end`` and leaves it again when a record
    of it follows. Other errors go to ``on_error``; fatal ones raise.

    Raises:
        KafkaException: a fatal client error.
    """
    records: list[Message] = []
    for record in fetched:
        error = record.error()
        if error is None:
            records.append(record)
            at_end.discard(record.partition() or 0)
        elif error.code() == KafkaError._PARTITION_EOF:
            at_end.add(record.partition() or 0)
        else:
            if on_error is not None:
                on_error(error)
            if error.fatal():
                raise KafkaException(error)
    return records


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
            count += len(records_and_ends(consumer.consume(1_000, 0.5), at_end))
    finally:
        consumer.close()
    return count
