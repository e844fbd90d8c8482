"""Reading partitions to their end: partition EOF events, never ListOffsets (BROKER.md)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.clients import new_consumer
from kmq_dagster.settings import KmqSettings

ErrorHook = Callable[[KafkaError], None]


def split_fetched(
    fetched: list[Message], on_error: ErrorHook | None = None
) -> tuple[list[Message], list[tuple[str, int]]]:
    """The records among ``fetched`` (from a consumer with ``enable.partition.eof``), and the
    (topic, partition) pairs that reported their end, in order.

    Raises:
        KafkaException: a fatal client error (others go to ``on_error``).
    """
    records: list[Message] = []
    ended: list[tuple[str, int]] = []
    for record in fetched:
        error = record.error()
        if error is None:
            records.append(record)
        elif _is_end(error, on_error):
            ended.append((record.topic() or "", record.partition() or 0))
    return records, ended


def records_and_ends(
    fetched: list[Message], at_end: set[int], on_error: ErrorHook | None = None
) -> list[Message]:
    """The records among ``fetched`` of one topic's partitions.

    A partition that reports its end is added to ``at_end`` and leaves it again when a record
    of it follows.

    Raises:
        KafkaException: a fatal client error (others go to ``on_error``).
    """
    records: list[Message] = []
    for record in fetched:
        error = record.error()
        if error is None:
            records.append(record)
            at_end.discard(record.partition() or 0)
        elif _is_end(error, on_error):
            at_end.add(record.partition() or 0)
    return records


def _is_end(error: KafkaError, on_error: ErrorHook | None) -> bool:
    """Whether ``error`` is a partition's end; any other is reported, and raised if fatal."""
    if error.code() == KafkaError._PARTITION_EOF:
        return True
    if on_error is not None:
        on_error(error)
    if error.fatal():
        raise KafkaException(error)
    return False


def read_to_end(
    consumer: Consumer,
    partitions: Collection[int],
    *,
    timeout_s: float | None = 60.0,
    batch: int = 1_000,
    poll_s: float = 0.5,
    on_error: ErrorHook | None = None,
) -> Iterator[list[Message]]:
    """Yield the records ``consumer`` fetches, a batch at a time, until each of ``partitions``
    has reported its end. The consumer needs ``enable.partition.eof``; stop iterating early to
    read less.

    Raises:
        KmqTimeoutError: not every partition reached its end within ``timeout_s``.
        KafkaException: a fatal client error.
    """
    at_end: set[int] = set()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not at_end >= set(partitions):
        if deadline is not None and time.monotonic() > deadline:
            waiting = sorted(set(partitions) - at_end)
            raise KmqTimeoutError(
                f"partitions {waiting} were not read to their end within {timeout_s:g} s"
            )
        records = records_and_ends(consumer.consume(batch, poll_s), at_end, on_error)
        if records:
            yield records


def assigned_reader(
    settings: KmqSettings, topic: str, start_offsets: Mapping[int, int], **extra: object
) -> Consumer:
    """A consumer that reads ``topic`` from ``start_offsets`` (partition -> offset), belongs to
    no working group and never commits. Close it when done."""
    consumer = new_consumer(
        settings, f"kmq-reader-{uuid.uuid4().hex}", **{"enable.partition.eof": True, **extra}
    )
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in start_offsets.items()])
    return consumer


def count_records(
    settings: KmqSettings, topic: str, partitions: int, timeout_s: float = 60.0
) -> int:
    """How many records ``topic`` holds now (read from the start, without a group).

    Raises:
        KmqTimeoutError: not every partition reached its end in time.
    """
    consumer = assigned_reader(settings, topic, dict.fromkeys(range(partitions), 0))
    try:
        return sum(
            len(records)
            for records in read_to_end(consumer, range(partitions), timeout_s=timeout_s)
        )
    finally:
        consumer.close()
