"""Which dead letters a query, a discard or a replay touches: one filter, built into SQL with
bound parameters only (never spliced into SQL text), the same on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, bindparam, func, select

from kmq_dagster.audit.models import (
    STATUSES,
    DeadLetter,
    DeadLetterEvent,
    DeadLetterHeader,
    DeadLetterSearch,
)
from kmq_dagster.core.headers import KMQ_HEADER_PREFIX
from kmq_dagster.errors import ConfigError


def at_dlq_record(
    model: type[DeadLetter] | type[DeadLetterEvent], topic: Any, partition: Any, offset: Any
) -> ColumnElement[bool]:
    """The rows of ``model`` about one DLQ record, named by its topic, partition and offset
    (values, or ``bindparam`` names for an executemany)."""
    return and_(
        model.dlq_topic == topic, model.dlq_partition == partition, model.dlq_offset == offset
    )


def in_dlq_span(
    topic: str, partition: int, first_offset: int, last_offset: int
) -> ColumnElement[bool]:
    """The stored dead letters of one DLQ partition from ``first_offset`` to ``last_offset``
    (both included)."""
    return and_(
        DeadLetter.dlq_topic == topic,
        DeadLetter.dlq_partition == partition,
        DeadLetter.dlq_offset.between(first_offset, last_offset),
    )


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters to select; every field given must match.

    Exact: queue, group, status, error type, error pattern, key, ids, header. Substrings:
    ``text`` (error message or reason, ``LIKE``), and case-sensitive on every backend
    ``reason`` and ``search`` (the value or the error message). Times: last failure in
    [since, until).
    """

    queue_topic: str | None = None
    group_id: str | None = None
    status: str | None = None
    error_type: str | None = None
    key: bytes | None = None
    #: Substring of the error message or the reason.
    text: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: The normalized error message (see :mod:`kmq_dagster.audit.causes`).
    error_pattern: str | None = None
    #: Substring of the reason (case-sensitive).
    reason: str | None = None
    #: Substring of the value (its first 4,096 characters as UTF-8) or of the error message;
    #: case-sensitive.
    search: str | None = None
    #: A user header: ``(name, value)``; value ``None``: the header is present at all.
    header: tuple[str, str | None] | None = None
    #: Only these dead letters (the console's selected rows).
    ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if self.header is not None:
            name = self.header[0]
            if not name:
                raise ConfigError("a header filter needs a header name")
            if name.lower().startswith(KMQ_HEADER_PREFIX):
                raise ConfigError(
                    f"{name} is a kmq header: filter by error type, reason, text or key instead"
                )
        for name in ("since", "until"):
            moment = getattr(self, name)
            if moment is not None and not isinstance(moment, datetime):
                # A string would be compared as text by SQLite and select anything.
                raise ConfigError(
                    f"{name} must be a datetime, got {type(moment).__name__}", setting=name
                )
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError("the start of the time range must be before its end")

    def describe(self) -> str:
        """The filters given, for the audit log."""
        given = {name: value for name, value in vars(self).items() if value is not None}
        shown = {
            name: repr(value.isoformat()) if isinstance(value, datetime) else repr(value)
            for name, value in given.items()
        }
        return ", ".join(f"{name}={value}" for name, value in shown.items()) or "everything"


#: The filter that selects every dead letter.
EVERYTHING = DeadLetterFilter()


def header_digest(value: bytes | None) -> str | None:
    """How a header value is stored for the name=value filter (``None``: no value)."""
    return hashlib.sha256(value).hexdigest() if value is not None else None


#: How a side-table filter (header, reason, search) joins ``dead_letters``: ``IN`` a
#: subquery; ``EXISTS`` per row (a page walking an index in time order, stopping after 50);
#: or, on SQLite, as a probe of the subquery's ids that never drives a lookup by id (counting
#: many rows from an index instead of reading thousands of wide rows one by one; PostgreSQL's
#: planner finds the hash join itself).
IN, EXISTS, PROBE = "in", "exists", "probe"


def conditions(where: DeadLetterFilter, dialect: str, *, sides: str = IN) -> list[Any]:
    """SQL conditions for ``where`` on the ``dead_letters`` table of a ``dialect`` database;
    ``sides`` says how side-table filters join (``IN``, ``EXISTS`` or ``PROBE``)."""
    found: list[Any] = []
    exact = {
        DeadLetter.queue_topic: where.queue_topic,
        DeadLetter.group_id: where.group_id,
        DeadLetter.status: where.status,
        DeadLetter.error_type: where.error_type,
        DeadLetter.error_pattern: where.error_pattern,
        DeadLetter.key: where.key,
    }
    found += [column == value for column, value in exact.items() if value is not None]
    if where.text is not None:
        pattern = _like_pattern(where.text)
        found.append(
            DeadLetter.error_message.like(pattern, escape="\\")
            | DeadLetter.reason.like(pattern, escape="\\")
        )
    if where.since is not None:
        found.append(DeadLetter.last_failure_at >= where.since)
    if where.until is not None:
        found.append(DeadLetter.last_failure_at < where.until)
    for side in side_filters(where, dialect).values():
        if sides == EXISTS:
            found.append(side.where(side.selected_columns[0] == DeadLetter.id).exists())
        elif sides == PROBE and dialect == "sqlite":  # "+ 0": no index on id for this term
            found.append((DeadLetter.id + 0).in_(side))
        else:
            found.append(DeadLetter.id.in_(side))
    if where.ids is not None:
        found.append(DeadLetter.id.in_(bindparam("ids", list(where.ids), expanding=True)))
    return found


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _contains(column: Any, needle: str, dialect: str) -> Any:
    """``needle`` occurs in the text ``column``, case-sensitively on every backend (no
    wildcard characters to escape)."""
    bound = bindparam(None, needle, type_=Text, unique=True)
    if dialect == "postgresql":
        return func.strpos(column, bound) > 0
    return func.instr(column, bound) > 0


def side_filters(where: DeadLetterFilter, dialect: str) -> dict[str, Any]:
    """The ids each side-table filter of ``where`` selects, as ``SELECT dead_letter_id``
    queries by field name (header, reason, search)."""
    found: dict[str, Any] = {}
    if where.header is not None:
        name, value = where.header
        query = select(DeadLetterHeader.dead_letter_id).where(DeadLetterHeader.name == name)
        if value is not None:
            query = query.where(DeadLetterHeader.value_sha256 == header_digest(value.encode()))
        found["header"] = query
    if where.reason is not None:
        reason = _contains(DeadLetterSearch.reason, where.reason, dialect)
        found["reason"] = select(DeadLetterSearch.dead_letter_id).where(reason)
    if where.search is not None:
        body = _contains(DeadLetterSearch.body, where.search, dialect)
        found["search"] = select(DeadLetterSearch.dead_letter_id).where(body)
    return found
