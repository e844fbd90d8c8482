"""Dead letters other frameworks write, read as ours (pure).

A dead-letter *format* says how a DLQ record's headers name where the message came from and
what went wrong. ``kmq`` is ours (``kmq-original-topic``, ``kmq-error-type``, ...); ``spring``
is what Spring Kafka's ``DeadLetterPublishingRecoverer`` (and so ``@RetryableTopic``) writes.

Everything that reads a dead letter (ingest into the audit store, ``kmq dlq``, replay's
selection and routing) reads it through :func:`reading_headers`: the record's own headers with
the ``kmq-*`` headers its format implies appended (the last value of a name wins), so there is
one code path for every format. The appended headers are for reading only: the store keeps the
record's headers as they are, and a replayed copy carries the record's headers, not these.

A header that is missing or malformed (a partition that is not 4 bytes, say) never fails the
read: the dead letter is kept, and its reason says what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP_MS,
    ORIGINAL_TOPIC,
    Headers,
    header_value,
)
from kmq_dagster.core.naming import validate_topic_name
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry_headers import TRACEBACK
from kmq_dagster.errors import ConfigError

#: Our own dead letters (the default).
KMQ = "kmq"
#: Spring Kafka's dead-letter topics (``DeadLetterPublishingRecoverer``, ``@RetryableTopic``).
SPRING = "spring"
FORMATS = (KMQ, SPRING)

# Spring Kafka's header names (``KafkaHeaders.DLT_*``) and encodings, as its recoverer writes
# them: strings UTF-8, the partition a 4-byte big-endian int, offset and timestamp 8-byte
# big-endian longs.
SPRING_ORIGINAL_TOPIC = "kafka_dlt-original-topic"
SPRING_ORIGINAL_PARTITION = "kafka_dlt-original-partition"
SPRING_ORIGINAL_OFFSET = "kafka_dlt-original-offset"
SPRING_ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"
SPRING_ORIGINAL_CONSUMER_GROUP = "kafka_dlt-original-consumer-group"
SPRING_EXCEPTION_FQCN = "kafka_dlt-exception-fqcn"
SPRING_EXCEPTION_MESSAGE = "kafka_dlt-exception-message"
SPRING_EXCEPTION_STACKTRACE = "kafka_dlt-exception-stacktrace"

#: Headers holding a failure's stack text, in any format (the console shows them as one).
TRACEBACK_HEADERS = (TRACEBACK, SPRING_EXCEPTION_STACKTRACE)

#: Replaying a foreign dead letter to ``original`` sends each to the topic its headers name;
#: an action records this as its target.
EACH_ORIGINAL_TOPIC = "(each dead letter's original topic)"


def check_format(name: str) -> str:
    """``name`` if it is a known dead-letter format.

    Raises:
        ConfigError: an unknown format.
    """
    if name not in FORMATS:
        raise ConfigError(
            f"unknown dead-letter format {name!r}; known: {', '.join(FORMATS)}", setting="format"
        )
    return name


@dataclass(frozen=True)
class ForeignDeadLetters(Queue):
    """A dead-letter topic named by itself, in a given format, rather than derived from a kmq
    queue: the topic a Spring application dead-letters to, say.

    It is stored and audited as the queue ``<dlq topic> / <format>``: its ``topic`` is the
    dead-letter topic and its ``group`` the format's name, so the console lists it as one
    queue, and a replay, a discard and an ingest of it take one lease. It has no retry or
    redelivery topics of its own: a replay sends each dead letter to its original topic (or
    to a topic chosen for the replay).
    """

    dead_letter_format: str = SPRING

    def __post_init__(self) -> None:
        # Not Queue's checks: it derives no topic names (a legal DLT name of 249 characters
        # is one), and has no redelivery rules of its own.
        validate_topic_name(self.topic)
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError(
                f"partitions must be at least 1, got {self.partitions}", setting="partitions"
            )
        check_format(self.dead_letter_format)
        if self.group != self.dead_letter_format:
            raise ConfigError(
                f"a foreign dead-letter topic is grouped under its format's name "
                f"({self.dead_letter_format}), not {self.group!r}",
                setting="group",
            )

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic itself."""
        return self.topic

    def __str__(self) -> str:
        return f"{self.topic} ({self.dead_letter_format} dead letters)"


def foreign_dead_letters(dlq_topic: str, dead_letter_format: str) -> ForeignDeadLetters:
    """The dead-letter topic ``dlq_topic`` written in ``dead_letter_format``.

    Raises:
        ConfigError: an illegal topic name or an unknown format.
    """
    check_format(dead_letter_format)
    return ForeignDeadLetters(dlq_topic, dead_letter_format, dead_letter_format=dead_letter_format)


def format_of(queue: Queue) -> str:
    """The dead-letter format of ``queue``'s DLQ (ours unless it is foreign)."""
    return queue.dead_letter_format if isinstance(queue, ForeignDeadLetters) else KMQ


def is_foreign(queue: Queue) -> bool:
    """Whether ``queue`` is a dead-letter topic named by itself (not a kmq queue's DLQ)."""
    return isinstance(queue, ForeignDeadLetters)


def reading_headers(dead_letter_format: str, headers: Headers) -> list[tuple[str, bytes | None]]:
    """``headers`` with the ``kmq-*`` headers ``dead_letter_format`` implies appended (see the
    module docstring); ours are returned as they are."""
    if dead_letter_format == SPRING:
        return [*headers, *_spring_as_kmq(headers)]
    return list(headers)


def _spring_as_kmq(headers: Headers) -> list[tuple[str, bytes | None]]:
    problems: list[str] = []
    derived: list[tuple[str, bytes | None]] = []

    def copy_text(source: str, target: str) -> None:
        raw = header_value(headers, source)
        if raw is not None:
            derived.append((target, raw))

    def copy_number(source: str, target: str, size: int) -> None:
        raw = header_value(headers, source)
        if raw is None:
            problems.append(f"no {source} header")
        elif len(raw) != size:
            problems.append(f"{source} is {len(raw)} bytes, not the {size} of a big-endian number")
        else:
            number = int.from_bytes(raw, "big", signed=True)
            if number < 0:
                problems.append(f"{source} is negative ({number})")
            else:
                derived.append((target, str(number).encode()))

    if header_value(headers, SPRING_ORIGINAL_TOPIC) is None:
        problems.append(f"no {SPRING_ORIGINAL_TOPIC} header")
    copy_text(SPRING_ORIGINAL_TOPIC, ORIGINAL_TOPIC)
    copy_number(SPRING_ORIGINAL_PARTITION, ORIGINAL_PARTITION, 4)
    copy_number(SPRING_ORIGINAL_OFFSET, ORIGINAL_OFFSET, 8)
    copy_number(SPRING_ORIGINAL_TIMESTAMP, ORIGINAL_TIMESTAMP_MS, 8)
    copy_text(SPRING_EXCEPTION_FQCN, ERROR_TYPE)
    copy_text(SPRING_EXCEPTION_MESSAGE, ERROR_MESSAGE)
    copy_text(SPRING_EXCEPTION_STACKTRACE, TRACEBACK)
    group = header_value(headers, SPRING_ORIGINAL_CONSUMER_GROUP)
    reason = "dead-lettered by Spring Kafka"
    if group is not None:
        reason += f" (consumer group {group.decode('utf-8', errors='replace')})"
    if problems:
        reason += "; unreadable headers: " + "; ".join(problems)
    derived.append((DLQ_REASON, reason.encode()))
    return derived
