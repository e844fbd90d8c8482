"""The ``kmq-*`` headers kmq adds to messages it moves; user headers always pass through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: What every header kmq writes starts with: a message without one carries no kmq metadata
#: (the audit store keeps their content in columns: error type, reason, origin...).
KMQ_HEADER_PREFIX = "kmq-"
#: How many times the tracker has redelivered this message.
REDELIVERY_COUNT = "kmq-redelivery-count"
#: Where the message was first produced (kept across every hop).
ORIGINAL_TOPIC = "kmq-original-topic"
ORIGINAL_PARTITION = "kmq-original-partition"
ORIGINAL_OFFSET = "kmq-original-offset"
ORIGINAL_TIMESTAMP_MS = "kmq-original-timestamp-ms"
#: The consumer group the copy belongs to (copies never cross groups).
GROUP = "kmq-group"
#: Why a message is in the dead-letter topic.
DLQ_REASON = "kmq-dlq-reason"
ERROR_TYPE = "kmq-error-type"
ERROR_MESSAGE = "kmq-error-message"

Headers = Sequence[tuple[str, bytes | None]]
#: Headers as Kafka clients accept them: a list of pairs or a dict, values str or bytes.
RawHeaders = Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]]


def normalize_headers(raw: RawHeaders | None) -> list[tuple[str, bytes | None]]:
    """Headers as a list of ``(name, bytes)`` pairs, order kept; ``str`` values UTF-8 encoded."""
    if not raw:  # most records carry none: no type check per message
        return []
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    return [(key, value.encode() if isinstance(value, str) else value) for key, value in pairs]


def has_kmq_headers(headers: Headers | None) -> bool:
    """True if any header is one of kmq's (``kmq-*``)."""
    return bool(headers) and any(key.startswith(KMQ_HEADER_PREFIX) for key, _ in headers or ())


def header_value(headers: Headers | None, name: str) -> bytes | None:
    """The last value of header ``name``, or ``None`` if absent."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found


def int_header(headers: Headers | None, name: str) -> int | None:
    """Header ``name`` as a non-negative integer; ``None`` if absent.

    Raises:
        ValueError: present but not a non-negative ASCII integer.
    """
    raw = header_value(headers, name)
    if raw is None:
        return None
    text = raw.decode("ascii", errors="strict") if raw.isascii() else None
    if text is None or not text.isdigit():
        raise ValueError(f"header {name} is not a non-negative integer: {raw[:40]!r}")
    return int(text)


def replace_headers(
    headers: Headers | None, updates: Mapping[str, str]
) -> list[tuple[str, bytes | None]]:
    """User headers unchanged and in order, every header named in ``updates`` set anew."""
    kept = [(key, value) for key, value in headers or () if key not in updates]
    return kept + [(key, value.encode()) for key, value in updates.items()]
