"""The message a Spark function gets on an executor, built for whole chunks at a time.

A Spark task hands its function tens of thousands of messages per second. A frozen dataclass
cost ~3 us per message to build here; a named tuple built from columns by
:func:`spark_messages` runs no Python frame per message (~0.4 us, most of it allocation). The
columns come from :func:`~kmq_dagster.kafka.record_columns.record_columns`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import NamedTuple

from kmq_dagster.kafka.record_columns import RecordColumns

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


def spark_messages(
    topic: str | Iterable[str], partition: int | Iterable[int], columns: RecordColumns
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
    return list(map(tuple.__new__, repeat(SparkMessage), rows))
