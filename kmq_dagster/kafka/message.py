"""The message a handler gets: a thin view of the Kafka record, decoded only when read."""

from __future__ import annotations

import sys
from collections import deque
from functools import cache
from itertools import compress, repeat
from operator import not_
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from confluent_kafka import Message

from kmq_dagster.core.headers import REDELIVERY_COUNT, Headers, int_header, normalize_headers
from kmq_dagster.core.retry_headers import Origin, origin_of, read_due_ms
from kmq_dagster.schemas.codec import decode_field

if TYPE_CHECKING:
    from kmq_dagster.schemas.codec import QueueCodecs


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

    @property
    def timestamp_ms(self) -> int: ...


class KmqMessage:
    """One message handed out by a :class:`~kmq_dagster.kafka.consumer.KmqConsumer`.

    Acknowledge it with ``consumer.ack(message)``; it is redelivered if that never happens.
    """

    __slots__ = ("_headers", "record", "value")

    #: The queue's value and key codecs: set on the class a consumer of a queue with a
    #: declared format hands out (:func:`message_class`), so a message costs nothing more.
    codecs: ClassVar[QueueCodecs | None] = None

    def __init__(self, record: Message) -> None:
        #: The confluent-kafka record underneath.
        self.record = record
        #: The value's bytes as stored (``None`` for a null value); read from the record once,
        #: when the view is made: a plain attribute, no Python call to read it in a handler
        #: (a property was 3% of a no-op worker's loop; a read-only property through a C getter
        #: cost more than that). Setting it changes only this view: retry and DLQ copies carry
        #: the record's bytes (:func:`fetched_value`).
        self.value: bytes | None = record.value()
        self._headers: list[tuple[str, bytes | None]] | None = None

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
    def timestamp_ms(self) -> int:
        return self.record.timestamp()[1]

    @property
    def headers(self) -> list[tuple[str, bytes | None]]:
        """Headers in order, values as bytes (``None`` for a null header value)."""
        if self._headers is None:  # read once, on first use
            self._headers = normalize_headers(self.record.headers())
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

    def decoded(self, value_type: type | None = None) -> Any:
        """The value decoded in the queue's declared format (see :class:`~kmq_dagster.Queue`'s
        ``value_format``): a dict for ``json``, ``avro`` and ``json-schema`` (``value_type(**it)``
        when given), a ``value_type`` message for ``protobuf`` (required there), the bytes for
        ``bytes``. Decoded on each call; :attr:`value` stays the original bytes.

        Raises:
            UndecodableValue: the value is not in its format; raised out of a handler, the
                message goes to the DLQ with the reason ("undecodable value: ...").
            RegistryUnavailable: the schema registry did not answer; raised out of a handler,
                the message is retried like any failure.
        """
        return decode_field(self.codecs, "value", self.value, value_type)

    def decoded_key(self, value_type: type | None = None) -> Any:
        """The key decoded in the queue's declared ``key_format``, as :meth:`decoded`."""
        return decode_field(self.codecs, "key", self.key, value_type)

    def __repr__(self) -> str:
        return f"KmqMessage({self.topic}[{self.partition}]@{self.offset})"


@cache
def message_class(codecs: QueueCodecs | None) -> type[KmqMessage]:
    """The message class a consumer of a queue with these codecs hands out."""
    if codecs is None:
        return KmqMessage
    return type("KmqMessage", (KmqMessage,), {"__slots__": (), "codecs": codecs})


def views_of(records: list[Message]) -> list[KmqMessage]:
    """``[KmqMessage(record) for record in records]`` at about two thirds of the cost.

    The consumer wraps every record it hands out, hundreds per batch. Allocating the views in
    a C-level pass and setting their slots in a plain loop (see :func:`_fill`) runs no Python
    frame per record.
    """
    views: list[KmqMessage] = list(map(object.__new__, repeat(KmqMessage, len(records))))
    _fill(views, records)
    return views


def _fill(views: list[KmqMessage], records: list[Message]) -> None:
    # A plain loop: CPython 3.11+ specialises a slot store, which costs half what setattr()
    # through map() does (47 against 96 ns per view measured here).
    for view, record in zip(views, records, strict=True):
        view.record = record
        view.value = record.value()
        view._headers = None


#: A free view's reference count as the pool reads it: its one list, and getrefcount's argument.
_FREE_REFCOUNT = 2


class ViewPool:
    """Hands out :class:`KmqMessage` views, reusing those of batches nobody holds any more.

    A consumer that allocated 500 new views per batch, while the previous batch's were still
    alive, pushed Python's generation-0 count past its threshold nearly every batch: 1,831
    collections (15 full) per million messages, ~230 ms of a ~1.2 s run. Reused views allocate
    nothing, so the collector stays as quiet as for bare records, and the process's collector
    settings stay the user's.

    A view is reused only when CPython's reference counts show that nothing but this pool
    refers to it, nor to the list it was handed out in: nobody can see a view change. Views a
    handler kept, an ack queue holds, or a batch the consumer still tracks are left alone.
    (Free-threaded builds count references differently: there, views are never reused.)

    Views still in use when their batch is reclaimed wait in the pool and are looked at again
    at each reclaim (up to ``WAITING_BATCHES`` batches' worth; past that the oldest are let
    go). A worker at concurrency 100 holds its last few fetches in its buffer, and the
    consumer's handout ledger holds a batch's list until its first message's ack is written:
    reclaiming only what was free at once reused 13% of its views, and allocating the rest
    set off about 3,000 collections per million messages.
    """

    #: A batch is reclaimed when this many newer ones were handed out since: the caller's
    #: variable holds the last batch while it asks for the next.
    AGE = 2
    #: Views still in use wait to be reused, up to this many batches' worth.
    WAITING_BATCHES = 4

    def __init__(self, message_type: type[KmqMessage] = KmqMessage) -> None:
        self._message_type = message_type
        self._handed_out: deque[list[KmqMessage]] = deque()
        #: Views of reclaimed batches that were still in use then, oldest first; only this
        #: list of the pool's refers to them.
        self._waiting: list[KmqMessage] = []
        is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
        self._reuse = is_gil_enabled is None or bool(is_gil_enabled())
        #: Views reused and views allocated so far.
        self.reused = 0
        self.allocated = 0

    def views_of(self, records: list[Message]) -> list[KmqMessage]:
        """Views of ``records``, as :func:`views_of` gives them."""
        if not records:
            return []
        spare = self._reclaim(len(records) * self.WAITING_BATCHES)
        missing = len(records) - len(spare)
        if missing > 0:
            spare += map(object.__new__, repeat(self._message_type, missing))
            self.allocated += missing
        self.reused += len(records) - max(missing, 0)
        if missing < 0:  # more were free than this batch takes: the rest wait for the next
            self._waiting += spare[len(records) :]
            del spare[len(records) :]
        views = spare
        _fill(views, records)
        if self._reuse:
            self._handed_out.append(views)
        return views

    def _reclaim(self, max_waiting: int) -> list[KmqMessage]:
        """The views nobody else refers to, of the oldest batch handed out and of those
        waiting; the rest wait (the newest ``max_waiting`` of them)."""
        if len(self._handed_out) < self.AGE:
            return []
        oldest = self._handed_out.popleft()
        waiting = self._waiting
        # References: ``oldest`` and getrefcount's argument; any more is somebody else's.
        if not waiting and sys.getrefcount(oldest) == 2:
            # Each view: the list and getrefcount's argument.
            counts = list(map(sys.getrefcount, oldest))
            if counts.count(2) == len(counts):
                return oldest  # the usual case at concurrency 1: the whole batch, as it is
        waiting += oldest
        # Only ``waiting`` is the pool's now: a view whose batch list somebody else still
        # holds counts that list's reference too, and stays.
        del oldest
        # Each view: ``waiting`` and getrefcount's argument. C-level passes only: at
        # concurrency 100 a few hundred views wait, looked at for every fetch.
        is_free = list(map(_FREE_REFCOUNT.__eq__, map(sys.getrefcount, waiting)))
        free = list(compress(waiting, is_free))
        if len(free) < len(waiting):
            in_use = list(compress(waiting, map(not_, is_free)))
            self._waiting = in_use[-max_waiting:]
        else:
            self._waiting = []
        return free


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


def fetched_value(message: QueueMessage) -> bytes | None:
    """The value ``message`` was fetched with: for a :class:`KmqMessage`, its record's, whatever
    a handler set on the view's ``value`` (a plain attribute, for speed); what retry and DLQ
    copies carry."""
    if isinstance(message, KmqMessage):
        return message.record.value()
    return message.value


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
    """Where ``message`` was first produced, and when; its own coordinates and timestamp if its
    headers say nothing readable about that."""
    own = (message.topic, message.partition, message.offset, message.timestamp_ms)
    try:
        return origin_of(message.headers, *own)
    except ValueError:
        return Origin(*own)


def origin_coordinates(message: QueueMessage) -> tuple[str, int, int]:
    """(topic, partition, offset) of :func:`origin_or_own`."""
    origin = origin_or_own(message)
    return (origin.topic, origin.partition, origin.offset)
