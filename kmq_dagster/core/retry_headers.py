"""Headers of retried and dead-lettered copies, and reading them back safely.

A copy keeps every user header and carries ``kmq-*`` headers saying which attempt comes next,
when it is due, where the message was first produced, and what went wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP_MS,
    ORIGINAL_TOPIC,
    Headers,
    header_value,
    int_header,
)

#: Which attempt the copy is (1 = the first delivery from the queue topic).
ATTEMPT = "kmq-attempt"
#: Not to be processed before this wall-clock time, in milliseconds since the epoch.
DUE_MS = "kmq-due-ms"
#: When the message failed for the first time (ms since the epoch); kept across retries.
FIRST_FAILURE_MS = "kmq-first-failure-ms"
#: The failed attempt's traceback, cut to ``MAX_TRACEBACK_BYTES``.
TRACEBACK = "kmq-traceback"
#: Reason given when retry headers are missing or unreadable.
CORRUPT_RETRY_METADATA = "corrupt retry metadata"
#: Longest error message and traceback kept in headers (bytes of UTF-8).
MAX_ERROR_MESSAGE_BYTES = 1_024
MAX_TRACEBACK_BYTES = 8_192


@dataclass(frozen=True)
class Failure:
    """What went wrong in one attempt."""

    error_type: str
    error_message: str
    traceback: str = ""


@dataclass(frozen=True)
class Origin:
    """Where a message was first produced."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 without splitting a character."""
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) <= max_bytes:
        return text
    marker = "...[truncated]"
    kept = encoded[: max_bytes - len(marker)].decode("utf-8", errors="ignore")
    return kept + marker


def origin_of(
    headers: Headers | None, topic: str, partition: int, offset: int, ts_ms: int
) -> Origin:
    """The first-produced coordinates: from the headers if a previous hop set them, else these.

    Raises:
        ValueError: the headers name an origin but part of it is unreadable.
    """
    original_topic = header_value(headers, ORIGINAL_TOPIC)
    if original_topic is None:
        return Origin(topic, partition, offset, ts_ms)
    original_partition = int_header(headers, ORIGINAL_PARTITION)
    original_offset = int_header(headers, ORIGINAL_OFFSET)
    original_ts_ms = int_header(headers, ORIGINAL_TIMESTAMP_MS)
    if original_partition is None or original_offset is None:
        raise ValueError("origin headers are incomplete")
    try:
        name = original_topic.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("origin topic is not UTF-8") from None
    return Origin(name, original_partition, original_offset, original_ts_ms or 0)


def read_attempt(headers: Headers | None) -> int:
    """The attempt number a message carries (1 when it never failed before).

    Raises:
        ValueError: the attempt header is present but not a positive integer.
    """
    attempt = int_header(headers, ATTEMPT)
    if attempt is None:
        return 1
    if attempt < 1:
        raise ValueError(f"{ATTEMPT} must be at least 1, got {attempt}")
    return attempt


def read_due_ms(headers: Headers | None) -> int | None:
    """When a retried or delayed message is due; ``None`` if it carries no due time.

    Raises:
        ValueError: the due header is present but unreadable.
    """
    return int_header(headers, DUE_MS)


def copy_headers(
    origin: Origin,
    group: str,
    failure: Failure,
    *,
    attempt: int | None = None,
    due_ms: int | None = None,
    dlq_reason: str | None = None,
    first_failure_ms: int | None = None,
) -> Mapping[str, str]:
    """The ``kmq-*`` headers for a retry copy (``attempt`` and ``due_ms``) or a dead letter
    (``dlq_reason``); pass them to :func:`~kmq_dagster.core.headers.replace_headers`."""
    updates = {
        ORIGINAL_TOPIC: origin.topic,
        ORIGINAL_PARTITION: str(origin.partition),
        ORIGINAL_OFFSET: str(origin.offset),
        ORIGINAL_TIMESTAMP_MS: str(origin.timestamp_ms),
        GROUP: group,
        ERROR_TYPE: truncate_utf8(failure.error_type, 256),
        ERROR_MESSAGE: truncate_utf8(failure.error_message, MAX_ERROR_MESSAGE_BYTES),
        TRACEBACK: truncate_utf8(failure.traceback, MAX_TRACEBACK_BYTES),
    }
    if attempt is not None:
        updates[ATTEMPT] = str(attempt)
    if due_ms is not None:
        updates[DUE_MS] = str(due_ms)
    if dlq_reason is not None:
        updates[DLQ_REASON] = dlq_reason
    if first_failure_ms is not None:
        updates[FIRST_FAILURE_MS] = str(first_failure_ms)
    return updates


def read_first_failure_ms(headers: Headers | None, default_ms: int) -> int:
    """When the message first failed; ``default_ms`` if that is not recorded or unreadable."""
    try:
        return int_header(headers, FIRST_FAILURE_MS) or default_ms
    except ValueError:
        return default_ms
