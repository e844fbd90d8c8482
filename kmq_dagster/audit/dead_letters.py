"""A dead-letter record as a row of the audit store: whatever its headers hold, it gets a row.

The store keeps values (Schema Registry values decoded: :mod:`kmq_dagster.audit.stored_values`),
headers and error messages *masked*
(:mod:`kmq_dagster.core.masking`), values masked before they are cut at the stored limit: a
JSON value cut short can no longer be parsed, and must not reach the console, its exports or
its text search in clear. Nothing needs the raw bytes from the store: a replay copies the
record from the DLQ topic itself.
"""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime
from typing import Any

from kmq_dagster.audit.stored_values import value_columns
from kmq_dagster.core.dead_letter_formats import KMQ, reading_headers
from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    GROUP,
    KMQ_HEADER_PREFIX,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    Headers,
    header_value,
    int_header,
)
from kmq_dagster.core.masking import MASK, Masker, masker_from_env
from kmq_dagster.core.retry_headers import ATTEMPT, read_first_failure_ms
from kmq_dagster.schemas.preview import SchemaPreviewer

UNKNOWN = "unknown"


def dead_letter_row(
    *,
    dlq_topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int,
    queue_topic: str,
    group_id: str,
    ingested_at: datetime,
    masker: Masker | None = None,
    previewer: SchemaPreviewer | None = None,
    dead_letter_format: str = KMQ,
) -> dict[str, Any]:
    """The ``dead_letters`` row of one DLQ record; unreadable headers read as unknown.

    ``masker``: which names are secret (default: the patterns ``KMQ_MASKED_FIELDS`` extends).
    ``previewer``: decodes Schema Registry values (default: the registry
    ``KMQ_SCHEMA_REGISTRY_URL`` names, if set; see :mod:`kmq_dagster.audit.stored_values`).
    ``dead_letter_format``: how its headers say where it came from and why it failed
    (:mod:`kmq_dagster.core.dead_letter_formats`); the row keeps the headers as they are.
    A foreign dead letter is stored under ``group_id`` as given (its DLT's format), whatever
    group its headers name.
    """
    masker = masker or masker_from_env(os.environ)
    raw_headers, headers = headers, reading_headers(dead_letter_format, headers)
    group = _text(headers, GROUP) if dead_letter_format == KMQ else None
    size = len(value) if value is not None else 0
    return {
        "dlq_topic": dlq_topic,
        "dlq_partition": partition,
        "dlq_offset": offset,
        "queue_topic": queue_topic,
        "group_id": group or group_id,
        "key": key,
        **value_columns(value, masker, previewer),
        "value_size": size,
        "headers": [_header_json(name, raw, masker) for name, raw in raw_headers],
        "error_type": (_text(headers, ERROR_TYPE) or UNKNOWN)[:256],
        "error_message": masker.mask_text(_text(headers, ERROR_MESSAGE) or "")[0],
        "reason": _text(headers, DLQ_REASON) or UNKNOWN,
        "attempts": _int(headers, ATTEMPT) or 1,
        "original_topic": _text(headers, ORIGINAL_TOPIC),
        "original_partition": _int(headers, ORIGINAL_PARTITION),
        "original_offset": _int(headers, ORIGINAL_OFFSET),
        "first_failure_at": _utc(read_first_failure_ms(headers, timestamp_ms)),
        "last_failure_at": _utc(timestamp_ms),
        "status": "new",
        "ingested_at": ingested_at,
    }


def _text(headers: Headers, name: str) -> str | None:
    """A header as text; NUL characters become U+FFFD (PostgreSQL text cannot hold them)."""
    raw = header_value(headers, name)
    return without_nul(raw.decode("utf-8", errors="replace")) if raw is not None else None


def without_nul(text: str) -> str:
    """``text`` with NUL characters replaced: PostgreSQL refuses them in text columns."""
    return text.replace("\x00", "\N{REPLACEMENT CHARACTER}")


def _int(headers: Headers, name: str) -> int | None:
    try:
        return int_header(headers, name)
    except ValueError:
        return None


def _header_json(name: str, raw: bytes | None, masker: Masker) -> list[object]:
    """``[name, value, is_base64]``: UTF-8 values as text, anything else as base64; a user
    header with a secret's name as the mask, secrets inside other values (error messages and
    tracebacks too) masked."""
    if raw is None:
        return [name, None, False]
    by_name = masker.is_sensitive(name) and not name.lower().startswith(KMQ_HEADER_PREFIX)
    raw = MASK.encode() if by_name else masker.mask_bytes(raw)[0]
    try:
        return [name, raw.decode("utf-8"), False]
    except UnicodeDecodeError:
        return [name, base64.b64encode(raw).decode("ascii"), True]


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(max(ms, 0) / 1000, UTC)
