"""The message a handler gets: a thin view of the Kafka record, decoded only when read."""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import Protocol

from confluent_kafka import Message

from kmq_dagster.core.headers import REDELIVERY_COUNT, Headers, int_header, normalize_headers
from kmq_dagster.core.retry_headers import Origin, origin_of, read_due_ms


class QueueMessage(Protocol):
    """What routing and acknowledging need of a message, wherever it was read."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Headers: ...


class KmqMessage:
    """One message handed out by a :class:`~kmq_dagster.kafka.consumer.KmqConsumer`.

    Acknowledge it with ``consumer.ack(message)``; it is redelivered if that never happens.
    """

    __slots__ = ("_headers", "record")

    def __init__(self, record: Message) -> None:
        #: The confluent-kafka record underneath.
        self.record = record

    @property
    def topic(self) -> str:
        return self.record.topic() or ""

    @property
    def partition(self) -> int:
        return self.record.partition() or 0

    @property
    def offset(self) -> int:
        return record_offset(self.record)

    @property
    def key(self) -> bytes | None:
        return self.record.key()

    @property
    def value(self) -> bytes | None:
        return self.record.value()

    @property
    def timestamp_ms(self) -> int:
        return self.record.timestamp()[1]

    @property
    def headers(self) -> list[tuple[str, bytes | None]]:
        """Headers in order, values as bytes (``None`` for a null header value)."""
        try:
            return self._headers
        except AttributeError:  # read once, on first use
            self._headers: list[tuple[str, bytes | None]] = normalize_headers(self.record.headers())
            return self._headers

    @property
    def redelivery_count(self) -> int:
        """How often the tracker redelivered this message; 0 on first delivery.

        A malformed count reads as 0 here; the tracker dead-letters such a message if it
        ever has to redeliver it.
        """
        try:
            return int_header(self.headers, REDELIVERY_COUNT) or 0
        except ValueError:
            return 0

    def __repr__(self) -> str:
        return f"KmqMessage({self.topic}[{self.partition}]@{self.offset})"


def views_of(records: list[Message]) -> list[KmqMessage]:
    """``[KmqMessage(record) for record in records]`` at about two thirds of the cost.

    The consumer wraps every record it hands out, hundreds per batch. Allocating the views and
    setting their ``record`` slot in two C-level passes runs no Python frame per record:
    94 against 144 ns per record on the development machine.
    """
    views: list[KmqMessage] = list(map(object.__new__, repeat(KmqMessage, len(records))))
    deque(map(setattr, views, repeat("record"), records), maxlen=0)  # runs the map through
    return views


def record_of(message: KmqMessage | Message) -> Message:
    """The confluent-kafka record of a message a consumer handed out.

    Raises:
        TypeError: ``message`` is neither a KmqMessage nor a confluent-kafka record.
    """
    if isinstance(message, KmqMessage):
        return message.record
    if isinstance(message, Message):
        return message
    raise TypeError(f"not a message from a kmq consumer: {message!r}")


def record_source(record: Message) -> tuple[str, int]:
    """(topic, partition) of a confluent-kafka record."""
    return (record.topic() or "", record.partition() or 0)


def record_offset(record: Message) -> int:
    """Offset of a confluent-kafka record."""
    return record.offset() or 0


def due_ms_or_now(message: QueueMessage) -> int | None:
    """When ``message`` is due; an unreadable due time reads as due now (the worker then
    dead-letters it as corrupt retry metadata)."""
    try:
        return read_due_ms(message.headers)
    except ValueError:
        return None


def offset_of(message: QueueMessage) -> int:
    return message.offset


def origin_or_own(message: QueueMessage) -> Origin:
    """Where ``message`` was first produced; its own coordinates (no timestamp) if its headers
    say nothing readable about that."""
    try:
        return origin_of(message.headers, message.topic, message.partition, message.offset, 0)
    except ValueError:
        return Origin(message.topic, message.partition, message.offset, 0)


def origin_coordinates(message: QueueMessage) -> tuple[str, int, int]:
    """(topic, partition, offset) of :func:`origin_or_own`."""
    origin = origin_or_own(message)
    return (origin.topic, origin.partition, origin.offset)
