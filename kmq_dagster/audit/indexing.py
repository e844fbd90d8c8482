"""Side tables that keep the console's filters fast at a million dead letters.

``dead_letters`` rows are wide (the headers JSON carries a traceback of up to 8 KB), so any
filter that reads them one by one is slow, and JSON cannot be indexed the same way on every
backend. Two narrow side tables, written in the same transaction as the dead letters:

* ``dead_letter_headers``: one row per user header (not ``kmq-*``: those are columns), the
  value as a SHA-256 digest, so ``trace-id=abc`` is an index lookup;
* ``dead_letter_search``: the start of the value as text, the error message and the reason,
  so a substring search scans a few hundred bytes per dead letter instead of kilobytes.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select

from kmq_dagster.audit.dead_letters import without_nul
from kmq_dagster.audit.filters import header_digest, in_dlq_span
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.core.headers import KMQ_HEADER_PREFIX

#: How much of a value the text search covers, in characters.
SEARCHED_VALUE_CHARS = 4_096
#: How much of an error message or reason the text search covers.
SEARCHED_TEXT_CHARS = 2_048


def header_bytes(stored: Sequence[object]) -> bytes | None:
    """The raw value of one stored header ``[name, value, is_base64]``."""
    _name, value, is_base64 = stored
    if value is None:
        return None
    return base64.b64decode(str(value)) if is_base64 else str(value).encode()


def user_headers(stored_headers: Sequence[Sequence[object]]) -> list[tuple[int, str, str | None]]:
    """``(position, name, digest)`` of each user header of one dead letter."""
    return [
        (position, str(header[0]), header_digest(header_bytes(header)))
        for position, header in enumerate(stored_headers)
        if not str(header[0]).lower().startswith(KMQ_HEADER_PREFIX)
    ]


def search_body(value: bytes | None, error_message: str) -> str:
    """What the text search looks in: the start of the value (as UTF-8), then the message."""
    text = (value or b"")[: SEARCHED_VALUE_CHARS * 4].decode("utf-8", errors="replace")
    return without_nul(text[:SEARCHED_VALUE_CHARS] + "\n" + error_message[:SEARCHED_TEXT_CHARS])


def side_rows(
    dead_letter_id: int, row: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The header rows and the search row of one dead letter."""
    headers = [
        {"dead_letter_id": dead_letter_id, "position": position, "name": without_nul(name)[:255],
         "value_sha256": digest}
        for position, name, digest in user_headers(row["headers"] or [])
    ]  # fmt: skip
    search = {
        "dead_letter_id": dead_letter_id,
        "body": search_body(row["value"], row["error_message"]),
        "reason": without_nul(row["reason"][:SEARCHED_TEXT_CHARS]),
    }
    return headers, search


def index_dead_letters(
    connection: Connection,
    rows: Sequence[dict[str, Any]],
    insert_headers: Any,
    insert_search: Any,
) -> None:
    """Write the side rows of the dead letters ``rows`` (just inserted, or stored before:
    the two inserts skip rows already present)."""
    ids = _ids_by_coordinates(
        connection, [(row["dlq_topic"], row["dlq_partition"], row["dlq_offset"]) for row in rows]
    )
    headers: list[dict[str, Any]] = []
    searches: list[dict[str, Any]] = []
    for row in rows:
        dead_letter_id = ids.get((row["dlq_topic"], row["dlq_partition"], row["dlq_offset"]))
        if dead_letter_id is not None:
            header_rows, search = side_rows(dead_letter_id, row)
            headers += header_rows
            searches.append(search)
    if headers:
        connection.execute(insert_headers, headers)
    if searches:
        connection.execute(insert_search, searches)


def _ids_by_coordinates(
    connection: Connection, coordinates: list[tuple[str, int, int]]
) -> dict[tuple[str, int, int], int]:
    """Ids of stored dead letters, one query per (topic, partition) offset span."""
    spans: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in coordinates:
        spans.setdefault((topic, partition), []).append(offset)
    found: dict[tuple[str, int, int], int] = {}
    for (topic, partition), offsets in spans.items():
        query = select(DeadLetter.id, DeadLetter.dlq_offset).where(
            in_dlq_span(topic, partition, min(offsets), max(offsets))
        )
        for dead_letter_id, offset in connection.execute(query):
            found[(topic, partition, int(offset))] = int(dead_letter_id)
    return found
