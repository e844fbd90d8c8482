"""The message a Spark function gets on an executor, built for whole chunks at a time.

A Spark task hands its function tens of thousands of messages per second. A frozen dataclass
cost ~3 us per message to build here; a named tuple built from columns by
:func:`spark_messages` runs no Python frame per message (~0.4 us, most of it allocation). The
columns come from :func:`~kmq_dagster.kafka.record_columns.record_columns`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from kmq_dagster.kafka.record_columns import RecordColumns
from kmq_dagster.schemas.codec import decode_field

if TYPE_CHECKING:
    from kmq_dagster.schemas.codec import QueueCodecs

Headers = Sequence[tuple[str, bytes | None]]

_NO_HEADERS: Headers = ()


class SparkMessage(NamedTuple):
    """One queue message, as the user's function gets it on an executor.

    ``topic``, ``partition`` and ``offset`` say where this copy was read (a redelivered or
    retried copy is read from the group's redelivery or retry topic); the output rows carry
    the coordinates where the message was first produced.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    #: In order, values as bytes (``None`` for a null header value).
    headers: Headers = _NO_HEADERS
    timestamp_ms: int = 0

    def decoded(self, value_type: type | None = None) -> Any:
        """The value decoded in the queue's declared format, as
        :meth:`KmqMessage.decoded <kmq_dagster.kafka.message.KmqMessage.decoded>` gives it
        (raising ``UndecodableValue`` dead-letters the message, ``RegistryUnavailable``
        retries it)."""
        return decode_field(_codecs_of(self), "value", self.value, value_type)

    def decoded_key(self, value_type: type | None = None) -> Any:
        """The key decoded in the queue's declared ``key_format``."""
        return decode_field(_codecs_of(self), "key", self.key, value_type)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A queue's own subclass (spark_message_class) is made at run time; a pickled
        # message is a plain one.
        return (SparkMessage, tuple(self))


def _codecs_of(message: SparkMessage) -> QueueCodecs | None:
    return getattr(type(message), "codecs", None)


@cache
def spark_message_class(codecs: QueueCodecs | None) -> type[SparkMessage]:
    """The message class a queue with these codecs hands its Spark function."""
    if codecs is None:
        return SparkMessage
    return type("SparkMessage", (SparkMessage,), {"__slots__": (), "codecs": codecs})


def spark_messages(
    topic: str | Iterable[str],
    partition: int | Iterable[int],
    columns: RecordColumns,
    message_type: type[SparkMessage] = SparkMessage,
) -> list[SparkMessage]:
    """Messages from columns; ``topic`` and ``partition`` are one value for all, or a column
    each."""
    rows = zip(
        repeat(topic) if isinstance(topic, str) else topic,
        repeat(partition) if isinstance(partition, int) else partition,
        columns.offsets,
        columns.keys,
        columns.values,
        [headers or _NO_HEADERS for headers in columns.raw_headers],
        columns.timestamps_ms,
        strict=False,  # topic and partition may repeat endlessly; the columns are of one length
    )
    # tuple.__new__ over zipped columns: the whole chunk is built without a Python frame.
    return list(map(tuple.__new__, repeat(message_type), rows))
