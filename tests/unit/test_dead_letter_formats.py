"""Spring Kafka's dead letters read as ours: the exact header names and encodings Spring's
``DeadLetterPublishingRecoverer`` writes (4-byte big-endian partition, 8-byte big-endian offset
and timestamp, UTF-8 strings), and a clear reason, never a crash, for malformed ones."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.core.dead_letter_formats import (
    EACH_ORIGINAL_TOPIC,
    KMQ,
    SPRING,
    foreign_dead_letters,
    format_of,
    reading_headers,
)
from kmq_dagster.core.headers import ERROR_TYPE, ORIGINAL_TOPIC, header_value
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import TO_ORIGINAL, TO_RETRY, ReplaySelection
from kmq_dagster.core.replay_request import ReplayRequest, target_topic
from kmq_dagster.errors import ConfigError

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def spring_headers(
    *, topic: str = "orders", partition: bytes | None = None, offset: bytes | None = None
) -> list[tuple[str, bytes | None]]:
    """Headers as Spring Kafka writes them for a record of ``topic`` at 2:1234."""
    return [
        ("trace-id", b"abc"),
        ("kafka_dlt-original-topic", topic.encode()),
        ("kafka_dlt-original-partition", struct.pack(">i", 2) if partition is None else partition),
        ("kafka_dlt-original-offset", struct.pack(">q", 1234) if offset is None else offset),
        ("kafka_dlt-original-timestamp", struct.pack(">q", 1_764_201_600_000)),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"billing"),
        (
            "kafka_dlt-exception-fqcn",
            b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        ),
        ("kafka_dlt-exception-message", "card 4111 declined: naïve".encode()),
        ("kafka_dlt-exception-stacktrace", b"java.lang.IllegalStateException: declined\n\tat Foo"),
    ]


def row_of(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, object]:
    return dead_letter_row(
        dlq_topic="orders-dlt", partition=0, offset=7, key=b"k", value=b"{}", headers=headers,
        timestamp_ms=1_764_201_700_000, queue_topic="orders-dlt", group_id=SPRING,
        ingested_at=NOW, dead_letter_format=SPRING,
    )  # fmt: skip


def test_a_spring_dead_letter_is_stored_with_its_origin_error_and_group() -> None:
    # given the headers Spring writes; when stored as a Spring dead letter
    row = row_of(spring_headers())
    # then the row names its origin, its exception class and message, and its consumer group
    assert (row["original_topic"], row["original_partition"], row["original_offset"]) == (
        "orders", 2, 1234,
    )  # fmt: skip
    assert row["error_type"] == (
        "org.springframework.kafka.listener.ListenerExecutionFailedException"
    )
    assert row["error_message"] == "card 4111 declined: naïve"
    assert row["reason"] == "dead-lettered by Spring Kafka (consumer group billing)"
    # it is listed under its DLT and format, whatever group its headers name
    assert (row["queue_topic"], row["group_id"]) == ("orders-dlt", SPRING)
    # and the stored headers are the record's own, not the kmq ones read from them
    names = [name for name, _, _ in row["headers"]]  # type: ignore[attr-defined]
    assert names == [name for name, _ in spring_headers()]


@pytest.mark.parametrize(
    ("partition", "offset", "problem"),
    [
        (struct.pack(">q", 2), None, "kafka_dlt-original-partition is 8 bytes, not the 4"),
        (None, b"12", "kafka_dlt-original-offset is 2 bytes, not the 8"),
        (struct.pack(">i", -1), None, "kafka_dlt-original-partition is negative (-1)"),
    ],
)
def test_a_malformed_spring_header_gives_a_reason_not_a_crash(
    partition: bytes | None, offset: bytes | None, problem: str
) -> None:
    row = row_of(spring_headers(partition=partition, offset=offset))
    assert problem in str(row["reason"])
    assert row["original_topic"] == "orders"  # what is readable is still read


def test_a_spring_dead_letter_without_origin_headers_is_kept_with_the_reason() -> None:
    headers = [("kafka_dlt-exception-fqcn", b"java.lang.RuntimeException")]
    row = row_of(headers)
    assert row["original_topic"] is None and row["original_partition"] is None
    assert "no kafka_dlt-original-topic header" in str(row["reason"])
    assert "no kafka_dlt-original-offset header" in str(row["reason"])
    assert row["error_type"] == "java.lang.RuntimeException"


def test_kmq_headers_inside_a_spring_dead_letter_do_not_override_what_spring_says() -> None:
    # a replayed kmq copy that failed in a Spring application keeps our old headers
    headers = [(ORIGINAL_TOPIC, b"elsewhere"), (ERROR_TYPE, b"Old"), *spring_headers()]
    read = reading_headers(SPRING, headers)
    assert header_value(read, ORIGINAL_TOPIC) == b"orders"
    assert (
        header_value(read, ERROR_TYPE)
        == b"org.springframework.kafka.listener.ListenerExecutionFailedException"
    )


def test_a_selection_by_error_type_matches_spring_s_exception_class() -> None:
    selection = ReplaySelection(error_type="java.lang.RuntimeException")
    spring = [("kafka_dlt-exception-fqcn", b"java.lang.RuntimeException")]
    assert selection.matches(0, 0, None, reading_headers(SPRING, spring), 0)
    assert not selection.matches(0, 0, None, reading_headers(KMQ, spring), 0)


def test_a_foreign_topic_replays_to_each_original_or_a_chosen_topic_never_to_a_group() -> None:
    source = foreign_dead_letters("orders-dlt", SPRING)
    assert (source.dlq_topic, source.group, format_of(source)) == ("orders-dlt", SPRING, SPRING)
    assert format_of(Queue("orders", "billing")) == KMQ
    assert target_topic(source, ReplayRequest(target=TO_ORIGINAL)) == EACH_ORIGINAL_TOPIC
    assert target_topic(source, ReplayRequest(target=TO_ORIGINAL, to_topic="fixed")) == "fixed"
    with pytest.raises(ConfigError, match="no kmq group to retry in"):
        target_topic(source, ReplayRequest(target=TO_RETRY))


def test_an_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown dead-letter format 'celery'"):
        foreign_dead_letters("orders-dlt", "celery")


def test_a_dead_letter_topic_of_any_legal_name_can_be_read() -> None:
    longest = "d" * 249  # no kmq topic names are derived from it
    assert foreign_dead_letters(longest, SPRING).dlq_topic == longest
    with pytest.raises(ConfigError, match="illegal topic name"):
        foreign_dead_letters("no spaces", SPRING)
