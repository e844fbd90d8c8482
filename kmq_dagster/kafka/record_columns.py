"""Fetched records as columns: a chunk of one partition read in one C-level pass per field.

A Spark task reads tens of thousands of records per second; reading each one's fields in a
Python loop would cost a frame per record. ``map`` over the client's unbound methods does not.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple, cast

from confluent_kafka import Message

__all__ = ["Record", "RecordColumns", "record_columns"]

#: A fetched record as confluent-kafka hands it out; code outside kafka/ names it so.
Record = Message

_timestamp_ms = itemgetter(1)


class RecordColumns(NamedTuple):
    """A chunk of records of one partition, column by column."""

    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps_ms: list[int]
    #: As confluent-kafka gives them: ``None`` for a record without headers.
    raw_headers: list[Any]


def record_columns(records: list[Message]) -> RecordColumns:
    """The columns of ``records``, each read in one C-level pass."""
    return RecordColumns(
        cast("list[int]", list(map(Message.offset, records))),  # records have offsets
        list(map(Message.key, records)),
        list(map(Message.value, records)),
        list(map(_timestamp_ms, map(Message.timestamp, records))),
        list(map(Message.headers, records)),
    )
