"""The audit store: dead letters, operator actions, breaker states, alerts and snapshots.

One SQLAlchemy URL (:mod:`kmq_dagster.audit.database`), migrated on first use, safe for several
writers. Every query is built with SQLAlchemy expressions: values are always bound parameters,
never spliced into SQL text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kmq_dagster.audit.actions import (
    ANY,
    FAILED,
    STOPPED,
    SUCCEEDED,
    reap_abandoned,
    start_action,
)
from kmq_dagster.audit.causes import error_pattern
from kmq_dagster.audit.database import (
    HEAD_REVISION,
    default_url,
    engine_for,
    failure_reason,
    insert_ignoring_duplicates,
    migrate,
    schema_revision,
)
from kmq_dagster.audit.filters import EVERYTHING, at_dlq_record, conditions, in_dlq_span
from kmq_dagster.audit.filters import DeadLetterFilter as DeadLetterFilter  # noqa: PLC0414 (re-export)
from kmq_dagster.audit.history_events import record_discard_events
from kmq_dagster.audit.indexing import index_dead_letters
from kmq_dagster.audit.models import (
    STATUSES,
    Action,
    Alert,
    BreakerState,
    BreakerTransition,
    DeadLetter,
    DeadLetterHeader,
    DeadLetterSearch,
    QueueSnapshot,
)
from kmq_dagster.errors import AuditStoreError, ConfigError
from kmq_dagster.secrets import mask_url, register_url_secrets

__all__ = [
    "HEAD_REVISION",
    "AuditStore",
    "AuditStoreError",
    "DeadLetterFilter",
    "default_url",
    "migrate",
    "now",
    "schema_revision",
]

log = logging.getLogger(__name__)

#: A log table read back in the order it was written (by ``id``), per queue or whole.
_Logged = TypeVar("_Logged", Action, Alert)


class AuditStore:
    """Read and write the audit log at ``url`` (migrated to the newest schema on open)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        register_url_secrets(self.url)
        self.engine = engine_for(self.url)
        try:
            migrate(self.engine)
        except (SQLAlchemyError, OSError) as exc:
            self.engine.dispose()
            raise AuditStoreError(
                f"cannot open the audit store {self.url_for_display}: {failure_reason(exc)}"
            ) from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def url_for_display(self) -> str:
        """The URL with its secrets masked."""
        return mask_url(self.url)

    def session(self) -> Session:
        return self._sessions()

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Turn a database error inside into one clear :class:`AuditStoreError` (a full disk,
        a read-only file, a lost server: no SQLAlchemy traceback reaches an operator).

        Raises:
            AuditStoreError: ``the audit store URL refused to WHAT: REASON``.
        """
        try:
            yield
        except (SQLAlchemyError, OSError) as exc:
            raise AuditStoreError(
                f"the audit store {self.url_for_display} refused to {what}: {failure_reason(exc)}"
            ) from None

    def _conditions(self, where: DeadLetterFilter) -> list[Any]:
        return conditions(where, self.engine.dialect.name)

    # -- dead letters -------------------------------------------------------------------------

    def add_dead_letters(self, rows: Sequence[dict[str, Any]]) -> int:
        """Insert dead letters; one already stored (same DLQ coordinates) is left alone.

        Returns:
            How many rows were new (counted before inserting: a concurrent writer of the
            same rows can make this an overcount, never a duplicate row).
        """
        if not rows:
            return 0
        rows = [{**row, "error_pattern": error_pattern(row["error_message"])} for row in rows]
        statement = insert_ignoring_duplicates(
            self.engine, DeadLetter, ["dlq_topic", "dlq_partition", "dlq_offset"]
        )
        with self.engine.begin() as connection:
            present = sum(int(connection.execute(q).scalar_one()) for q in _existing(rows))
            # No RETURNING: with it, psycopg parses one huge statement (3.5x slower measured).
            connection.execute(statement, list(rows))
            index_dead_letters(
                connection,
                rows,
                insert_ignoring_duplicates(
                    self.engine, DeadLetterHeader, ["dead_letter_id", "position"]
                ),
                insert_ignoring_duplicates(self.engine, DeadLetterSearch, ["dead_letter_id"]),
            )
        return len(rows) - present

    def dead_letters(
        self, where: DeadLetterFilter = EVERYTHING, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        """Dead letters matching ``where``, newest first."""
        query = (
            select(DeadLetter)
            .where(*self._conditions(where))
            .order_by(DeadLetter.last_failure_at.desc(), DeadLetter.id.desc())
            .limit(limit)
            .offset(offset)
        )
        with self.session() as session:
            return list(session.scalars(query))

    def count_dead_letters(self, where: DeadLetterFilter = EVERYTHING) -> int:
        query = select(func.count()).select_from(DeadLetter).where(*self._conditions(where))
        with self.session() as session:
            return int(session.scalar(query) or 0)

    def set_status(
        self, dlq_topic: str, coordinates: Iterable[tuple[int, int]], status: str
    ) -> int:
        """Mark the dead letters at (partition, offset) of ``dlq_topic``; returns rows changed."""
        if status not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}")
        changed = 0
        with self.engine.begin() as connection:
            for partition, offset in coordinates:
                result = connection.execute(
                    update(DeadLetter)
                    .where(at_dlq_record(DeadLetter, dlq_topic, partition, offset))
                    .values(status=status)
                )
                changed += result.rowcount
        return changed

    def discard(
        self,
        where: DeadLetterFilter,
        *,
        actor: str,
        dry_run: bool = False,
        reason: str | None = None,
        on_wait: Callable[[Action], None] | None = None,
    ) -> int:
        """Mark the ``new`` dead letters ``where`` selects as discarded (a replay skips them),
        with a history event per dead letter giving ``reason``; returns how many (would have)
        changed.

        The action is recorded as started first; a discard waits for a running action on
        overlapping dead letters (``on_wait`` is told which) and is one transaction: all of
        it happens, or none.

        Raises:
            AuditStoreError: the store refused a write (nothing was discarded then).
        """
        selected = and_(*self._conditions(where), DeadLetter.status == "new")
        action = start_action(
            self, kind="discard", actor=actor, queue_topic=where.queue_topic or ANY,
            group_id=where.group_id or ANY, selection=where.describe(), target=None,
            dry_run=dry_run,
        )  # fmt: skip
        try:
            if not dry_run:
                action.acquire(on_wait=on_wait)
            with self.writing("discard the dead letters"), self.engine.begin() as connection:
                if dry_run:
                    count = int(
                        connection.execute(
                            select(func.count()).select_from(DeadLetter).where(selected)
                        ).scalar_one()
                    )
                else:
                    record_discard_events(connection, selected, actor=actor, reason=reason or "")
                    result = connection.execute(
                        update(DeadLetter).where(selected).values(status="discarded")
                    )
                    count = result.rowcount
        except BaseException as exc:
            stopped = not isinstance(exc, Exception)  # Ctrl-C, SIGTERM, exit
            note = action.fail(
                f"{'stopped' if stopped else 'failed'}, nothing discarded: "
                f"{exc or type(exc).__name__}",
                count=0,
                state=STOPPED if stopped else FAILED,
            )
            if isinstance(exc, AuditStoreError):
                raise AuditStoreError(f"{exc}; nothing was discarded{note}") from None
            raise
        action.finish(
            SUCCEEDED,
            count,
            f"{'would discard' if dry_run else 'discarded'} {count}"
            + (f": {reason}" if reason else ""),
        )
        return count

    def statuses(
        self, dlq_topic: str, partition: int, first_offset: int, last_offset: int
    ) -> dict[int, str]:
        """Status of the stored dead letters of one DLQ partition within an offset span."""
        query = select(DeadLetter.dlq_offset, DeadLetter.status).where(
            in_dlq_span(dlq_topic, partition, first_offset, last_offset)
        )
        with self.engine.connect() as connection:
            return {int(offset): str(status) for offset, status in connection.execute(query)}

    # -- actions, transitions, alerts, snapshots ----------------------------------------------

    def record_action(self, **fields: Any) -> None:
        """An operator action (``kind``, ``actor``, ``queue_topic``, ``group_id``,
        ``selection``, ``count``, ``target``, ``dry_run``, ``outcome``)."""
        self._insert(Action, {"at": now(), **fields})

    def has_ingested(self, queue_topic: str, group_id: str) -> bool:
        """Whether this store holds a dead letter of the group, or an ingest of its DLQ ever
        started here (whatever its end): if neither, the ingester group's committed position
        says nothing about this store."""
        ingests = (
            select(Action.id)
            .where(Action.kind == "ingest", Action.queue_topic == queue_topic)
            .where(Action.group_id == group_id)
            .limit(1)
        )
        rows = (
            select(DeadLetter.id)
            .where(DeadLetter.queue_topic == queue_topic, DeadLetter.group_id == group_id)
            .limit(1)
        )
        with self.engine.connect() as connection:
            return any(connection.execute(q).first() is not None for q in (ingests, rows))

    def actions(self, queue_topic: str | None = None) -> list[Action]:
        """Actions in the order they started; one whose process is gone reads ``interrupted``."""
        self.reap_abandoned_actions()
        return self._in_order(Action, queue_topic)

    def reap_abandoned_actions(self) -> int:
        """Write running actions whose process is gone as ``interrupted`` (see
        :mod:`kmq_dagster.audit.actions`); a store that refuses the write is only logged."""
        try:
            with self.engine.begin() as connection:
                return reap_abandoned(connection, now())
        except SQLAlchemyError:
            log.warning("could not mark abandoned actions as interrupted", exc_info=True)
            return 0

    def record_transition(self, **fields: Any) -> None:
        self._insert(BreakerTransition, fields)

    def transitions(self, queue_topic: str, group_id: str) -> list[BreakerTransition]:
        query = (
            select(BreakerTransition)
            .where(
                BreakerTransition.queue_topic == queue_topic, BreakerTransition.group_id == group_id
            )
            .order_by(BreakerTransition.id)
        )
        with self.session() as session:
            return list(session.scalars(query))

    def record_alert(self, **fields: Any) -> None:
        self._insert(Alert, {"at": now(), **fields})

    def alerts(self, queue_topic: str | None = None) -> list[Alert]:
        return self._in_order(Alert, queue_topic)

    def record_snapshot(self, **fields: Any) -> None:
        self._insert(QueueSnapshot, {"at": now(), **fields})

    # -- the shared breaker state -------------------------------------------------------------

    def breaker_state(self, queue_topic: str, group_id: str) -> BreakerState | None:
        with self.session() as session:
            return session.get(BreakerState, (queue_topic, group_id))

    def save_breaker_state(
        self,
        queue_topic: str,
        group_id: str,
        *,
        state: str,
        opened_at_ms: int,
        cooldown_ms: int,
        expected_version: int | None,
    ) -> bool:
        """Write the breaker's state if nobody else wrote it since ``expected_version`` was read
        (``None``: it did not exist). Returns whether this write won."""
        values = {"state": state, "opened_at_ms": opened_at_ms, "cooldown_ms": cooldown_ms}
        with self.engine.begin() as connection:
            if expected_version is None:
                statement = insert_ignoring_duplicates(
                    self.engine, BreakerState, ["queue_topic", "group_id"]
                )
                row = {"queue_topic": queue_topic, "group_id": group_id, "version": 1, **values}
                inserted = connection.execute(statement.returning(BreakerState.version), [row])
                return bool(inserted.all())
            result = connection.execute(
                update(BreakerState)
                .where(
                    BreakerState.queue_topic == queue_topic,
                    BreakerState.group_id == group_id,
                    BreakerState.version == expected_version,
                )
                .values(version=expected_version + 1, **values)
            )
            return result.rowcount == 1

    def _in_order(self, model: type[_Logged], queue_topic: str | None) -> list[_Logged]:
        """Every row of ``model`` in the order it was written; only ``queue_topic``'s if given."""
        query = select(model).order_by(model.id)
        if queue_topic is not None:
            query = query.where(model.queue_topic == queue_topic)
        with self.session() as session:
            return list(session.scalars(query))

    def _insert(self, model: type[Any], fields: dict[str, Any]) -> None:
        with self.engine.begin() as connection:
            connection.execute(insert(model), [fields])

    def close(self) -> None:
        self.engine.dispose()


def now() -> datetime:
    return datetime.now(UTC)


def _existing(rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Count queries for stored rows among ``rows``: one per (topic, partition) offset span
    (a consumer's batch is contiguous per partition; a span on bound parameters only)."""
    spans: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        spans.setdefault((row["dlq_topic"], row["dlq_partition"]), []).append(row["dlq_offset"])
    return [
        select(func.count())
        .select_from(DeadLetter)
        .where(in_dlq_span(topic, partition, min(offsets), max(offsets)))
        for (topic, partition), offsets in spans.items()
    ]
