"""Browsing the stored dead letters: keyset pages, counts by cause, one dead letter, and the
DLQ coordinates a filter selects (what a replay of "the whole filter" moves).

Pages are keyset-paginated on (last failure, id), newest first: a page is "the rows after this
one", so rows that arrive while someone pages through never shift or repeat rows on the pages
that follow, and page 20,000 costs what page 1 costs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select, tuple_

from kmq_dagster.audit.filters import (
    EXISTS,
    IN,
    PROBE,
    DeadLetterFilter,
    conditions,
    side_filters,
)
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.errors import ConfigError

if TYPE_CHECKING:
    from kmq_dagster.audit.store import AuditStore

#: Rows per page unless asked otherwise.
DEFAULT_PAGE_SIZE = 50
#: The most rows one page may hold.
MAX_PAGE_SIZE = 1_000
#: A header, reason or text filter matching at most this many is looked up by id (each a
#: random read of a wide row: a thousand take milliseconds, tens of thousands seconds).
NARROW_IDS = 1_000


@dataclass(frozen=True)
class Cursor:
    """A position in the newest-first order: the last row of a page."""

    last_failure_at: datetime
    id: int


@dataclass(frozen=True)
class Page:
    rows: list[DeadLetter]
    #: Where the next page starts; ``None`` on the last page.
    next_cursor: Cursor | None


@dataclass(frozen=True)
class CauseCount:
    """Dead letters with one error type and error pattern."""

    error_type: str
    error_pattern: str
    count: int
    latest: datetime


@dataclass(frozen=True)
class DlqSelection:
    """The DLQ records a filter selects, all of one queue and group."""

    queue_topic: str
    group_id: str
    dlq_topic: str
    #: Sorted DLQ offsets per partition.
    offsets: dict[int, list[int]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(offsets) for offsets in self.offsets.values())


def page(
    store: AuditStore,
    where: DeadLetterFilter,
    *,
    after: Cursor | None = None,
    size: int = DEFAULT_PAGE_SIZE,
) -> Page:
    """Up to ``size`` dead letters matching ``where``, newest first, after ``after``.

    Raises:
        ConfigError: ``size`` outside 1..MAX_PAGE_SIZE.
    """
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ConfigError(f"a page holds 1 to {MAX_PAGE_SIZE} rows, not {size}")
    narrow, broad = narrowed(store, where)
    query = select(DeadLetter).where(
        *conditions(narrow, store.engine.dialect.name, sides=EXISTS if broad else IN)
    )
    if after is not None:
        position = tuple_(DeadLetter.last_failure_at, DeadLetter.id)
        query = query.where(position < tuple_(after.last_failure_at, after.id))
    query = query.order_by(DeadLetter.last_failure_at.desc(), DeadLetter.id.desc()).limit(size + 1)
    with store.session() as session:
        rows = list(session.scalars(query))
    if len(rows) <= size:
        return Page(rows, None)
    last = rows[size - 1]
    return Page(rows[:size], Cursor(last.last_failure_at, last.id))


def cause_counts(store: AuditStore, where: DeadLetterFilter) -> list[CauseCount]:
    """Dead letters matching ``where`` counted by error type and error pattern, most first."""
    narrow, _ = narrowed(store, where)
    # Grouped in the order of the cause index (queue, group first): no sort of a million
    # rows; the few groups per cause are added up here.
    query = (
        select(func.count(), func.max(DeadLetter.last_failure_at), DeadLetter.error_type,
               DeadLetter.error_pattern)
        .where(*conditions(narrow, store.engine.dialect.name, sides=PROBE))
        .group_by(DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.error_type,
                  DeadLetter.error_pattern)
    )  # fmt: skip
    counts: dict[tuple[str, str], tuple[int, datetime]] = {}
    with store.engine.connect() as connection:
        for n, latest, error_type, pattern in connection.execute(query):
            cause = (str(error_type), str(pattern))
            before, seen = counts.get(cause, (0, latest))
            counts[cause] = (before + int(n), max(seen, latest))
    return sorted(
        (CauseCount(*cause, n, latest) for cause, (n, latest) in counts.items()),
        key=lambda c: (-c.count, c.error_type, c.error_pattern),
    )


def dead_letter(store: AuditStore, dead_letter_id: int) -> DeadLetter | None:
    """One dead letter by its id, or ``None``."""
    with store.session() as session:
        return session.get(DeadLetter, dead_letter_id)


def queues(store: AuditStore) -> list[tuple[str, str]]:
    """Every (queue topic, group) with stored dead letters, sorted."""
    query = (
        select(DeadLetter.queue_topic, DeadLetter.group_id)
        .group_by(DeadLetter.queue_topic, DeadLetter.group_id)
        .order_by(DeadLetter.queue_topic, DeadLetter.group_id)
    )
    with store.engine.connect() as connection:
        return [(str(topic), str(group)) for topic, group in connection.execute(query)]


def dlq_selection(store: AuditStore, where: DeadLetterFilter) -> DlqSelection:
    """The DLQ coordinates of every dead letter ``where`` selects.

    Raises:
        ConfigError: the filter selects nothing, or dead letters of several queues or groups
            (a replay moves one group's dead letters).
    """
    narrow, _ = narrowed(store, where)
    query = select(
        DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.dlq_topic,
        DeadLetter.dlq_partition, DeadLetter.dlq_offset,
    ).where(*conditions(narrow, store.engine.dialect.name, sides=PROBE))  # fmt: skip
    offsets: dict[tuple[str, str, str], dict[int, list[int]]] = defaultdict(
        lambda: defaultdict(list)
    )
    with store.engine.connect() as connection:
        for topic, group, dlq, partition, offset in connection.execute(query):
            offsets[(topic, group, dlq)][int(partition)].append(int(offset))
    if not offsets:
        raise ConfigError("the filter selects no dead letters")
    if len(offsets) > 1:
        names = ", ".join(sorted(f"{topic} / {group}" for topic, group, _ in offsets))
        raise ConfigError(f"choose one queue and group: the filter selects dead letters of {names}")
    (((topic, group, dlq), found),) = offsets.items()
    return DlqSelection(topic, group, dlq, {p: sorted(o) for p, o in sorted(found.items())})


def narrowed(store: AuditStore, where: DeadLetterFilter) -> tuple[DeadLetterFilter, bool]:
    """``where`` with each side-table filter (header, reason, search) that matches at most
    ``NARROW_IDS`` dead letters replaced by their ids, and whether one matched more.

    No planner guesses right for both ``trace-id=<one id>`` and ``tenant=<a large one>``:
    asking first makes a rare match a lookup by id, and leaves a common one to a walk in
    time order that stops after a page.
    """
    sides = side_filters(where, store.engine.dialect.name)
    ids = None if where.ids is None else set(where.ids)
    broad = False
    replaced: dict[str, None] = {}
    with store.engine.connect() as connection:
        for name, query in sides.items():
            found = set(connection.execute(query.limit(NARROW_IDS + 1)).scalars())
            if len(found) > NARROW_IDS:
                broad = True
                continue
            ids = found if ids is None else ids & found
            replaced[name] = None
    if not replaced:
        return where, broad
    return dataclasses.replace(where, ids=tuple(sorted(ids or ())), **replaced), broad


def refresh_statistics(store: AuditStore) -> None:
    """Give the query planner current row counts, so it picks the right index (a key lookup
    over a walk in time order). SQLite never collects them on its own: ``ANALYZE`` with an
    ``analysis_limit`` samples each index (tens of milliseconds at a million dead letters).
    PostgreSQL's autovacuum does it eventually; this does it now."""
    with store.engine.begin() as connection:
        if store.engine.dialect.name == "sqlite":
            connection.exec_driver_sql("PRAGMA analysis_limit=1000")
            connection.exec_driver_sql("ANALYZE")
        elif store.engine.dialect.name == "postgresql":
            connection.exec_driver_sql(
                "ANALYZE dead_letters, dead_letter_headers, dead_letter_search, dead_letter_events"
            )
