"""Sorting a fetched batch into records and partition ends."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from kmq_dagster.kafka.topic_reader import records_and_ends


def event(partition: int, code: int, fatal: bool = False) -> Message:
    return Message(topic="t", partition=partition, error=KafkaError(code, "x", fatal=fatal))


def record(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset, value=b"v")


def test_records_are_kept_and_ends_noted_until_a_partition_gets_more() -> None:
    at_end: set[int] = set()
    errors: list[KafkaError] = []
    fetched = [
        record(0, 1),
        event(0, KafkaError._PARTITION_EOF),
        event(1, KafkaError._PARTITION_EOF),
        event(1, KafkaError._MSG_TIMED_OUT),
        record(1, 7),
    ]

    records = records_and_ends(fetched, at_end, errors.append)

    assert [(r.partition(), r.offset()) for r in records] == [(0, 1), (1, 7)]
    assert at_end == {0}  # partition 1 reached its end, then got another record
    assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT]


def test_a_fatal_error_raises_after_it_was_reported() -> None:
    errors: list[KafkaError] = []
    with pytest.raises(KafkaException):
        records_and_ends([event(0, KafkaError._FENCED, fatal=True)], set(), errors.append)
    assert len(errors) == 1
