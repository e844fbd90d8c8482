"""The audit store: one SQLAlchemy URL, migrated on first use, safe for several writers.

SQLite (the default, a file) runs in WAL mode with a busy timeout, so several processes can
write; any other SQLAlchemy URL works (PostgreSQL is tested). Every query is built with
SQLAlchemy expressions: values are always bound parameters, never spliced into SQL text.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, and_, create_engine, event, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from kmq_dagster.audit.causes import error_pattern
from kmq_dagster.audit.filters import EVERYTHING, conditions
from kmq_dagster.audit.filters import DeadLetterFilter as DeadLetterFilter  # noqa: PLC0414 (re-export)
from kmq_dagster.audit.history import record_discard_events
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
from kmq_dagster.errors import ConfigError, KmqError

#: Environment variable naming the store; default: a SQLite file in ``~/.kmq``.
URL_ENV = "KMQ_AUDIT_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
HEAD_REVISION = "0003"


class AuditStoreError(KmqError):
    """The audit store could not be opened or migrated."""


def default_url() -> str:
    """``$KMQ_AUDIT_URL``, else ``sqlite:///~/.kmq/audit.db``."""
    configured = os.environ.get(URL_ENV)
    if configured:
        return configured
    path = Path.home() / ".kmq" / "audit.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


class AuditStore:
    """Read and write the audit log at ``url`` (migrated to the newest schema on open)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        try:
            self.engine = _engine(self.url)
            migrate(self.engine)
        except OperationalError as exc:
            raise AuditStoreError(
                f"cannot open the audit store {_safe(self.url)}: {exc.orig}"
            ) from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def url_for_display(self) -> str:
        """The URL without its password."""
        return _safe(self.url)

    def session(self) -> Session:
        return self._sessions()

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
        statement = _insert_ignoring_duplicates(
            self.engine, DeadLetter, ["dlq_topic", "dlq_partition", "dlq_offset"]
        )
        with self.engine.begin() as connection:
            present = sum(int(connection.execute(q).scalar_one()) for q in _existing(rows))
            # No RETURNING: with it, psycopg parses one huge statement (3.5x slower measured).
            connection.execute(statement, list(rows))
            index_dead_letters(
                connection,
                rows,
                _insert_ignoring_duplicates(
                    self.engine, DeadLetterHeader, ["dead_letter_id", "position"]
                ),
                _insert_ignoring_duplicates(self.engine, DeadLetterSearch, ["dead_letter_id"]),
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
                    .where(
                        DeadLetter.dlq_topic == dlq_topic,
                        DeadLetter.dlq_partition == partition,
                        DeadLetter.dlq_offset == offset,
                    )
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
    ) -> int:
        """Mark the ``new`` dead letters ``where`` selects as discarded (a replay skips them),
        write the action and, per dead letter, a history event with ``reason``; returns how
        many (would have) changed."""
        selected = and_(*self._conditions(where), DeadLetter.status == "new")
        with self.engine.begin() as connection:
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
        self.record_action(
            kind="discard",
            actor=actor,
            queue_topic=where.queue_topic or "*",
            group_id=where.group_id or "*",
            selection=where.describe(),
            count=count,
            target=None,
            dry_run=dry_run,
            outcome=f"{'would discard' if dry_run else 'discarded'} {count}"
            + (f": {reason}" if reason else ""),
        )
        return count

    def statuses(
        self, dlq_topic: str, partition: int, first_offset: int, last_offset: int
    ) -> dict[int, str]:
        """Status of the stored dead letters of one DLQ partition within an offset span."""
        query = select(DeadLetter.dlq_offset, DeadLetter.status).where(
            DeadLetter.dlq_topic == dlq_topic,
            DeadLetter.dlq_partition == partition,
            DeadLetter.dlq_offset.between(first_offset, last_offset),
        )
        with self.engine.connect() as connection:
            return {int(offset): str(status) for offset, status in connection.execute(query)}

    # -- actions, transitions, alerts, snapshots ----------------------------------------------

    def record_action(self, **fields: Any) -> None:
        """An operator action (``kind``, ``actor``, ``queue_topic``, ``group_id``,
        ``selection``, ``count``, ``target``, ``dry_run``, ``outcome``)."""
        self._insert(Action, {"at": now(), **fields})

    def actions(self, queue_topic: str | None = None) -> list[Action]:
        query = select(Action).order_by(Action.id)
        if queue_topic is not None:
            query = query.where(Action.queue_topic == queue_topic)
        with self.session() as session:
            return list(session.scalars(query))

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
        query = select(Alert).order_by(Alert.id)
        if queue_topic is not None:
            query = query.where(Alert.queue_topic == queue_topic)
        with self.session() as session:
            return list(session.scalars(query))

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
                statement = _insert_ignoring_duplicates(
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

    def _insert(self, model: type[Any], fields: dict[str, Any]) -> None:
        with self.engine.begin() as connection:
            connection.execute(insert(model), [fields])

    def close(self) -> None:
        self.engine.dispose()


def now() -> datetime:
    return datetime.now(UTC)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent; safe if several processes race:
    PostgreSQL takes an advisory lock, a SQLite file a lock file beside it)."""
    with _sqlite_migration_lock(engine):
        _upgrade(engine)


def _upgrade(engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", "kmq_dagster.audit:migrations")
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":  # one migrator at a time
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(4242001)")
        current = MigrationContext.configure(connection).get_current_revision()
        if current == HEAD_REVISION:
            return
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextlib.contextmanager
def _sqlite_migration_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def schema_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(
        url, poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    return engine


def _insert_ignoring_duplicates(engine: Engine, model: type[Any], unique: list[str]) -> Any:
    if engine.dialect.name == "postgresql":
        return postgresql.insert(model).on_conflict_do_nothing(index_elements=unique)
    if engine.dialect.name == "sqlite":
        return sqlite.insert(model).on_conflict_do_nothing(index_elements=unique)
    raise ConfigError(f"the audit store supports SQLite and PostgreSQL, not {engine.dialect.name}")


def _existing(rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Count queries for stored rows among ``rows``: one per (topic, partition) offset span
    (a consumer's batch is contiguous per partition; a span on bound parameters only)."""
    spans: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        spans.setdefault((row["dlq_topic"], row["dlq_partition"]), []).append(row["dlq_offset"])
    return [
        select(func.count())
        .select_from(DeadLetter)
        .where(
            DeadLetter.dlq_topic == topic,
            DeadLetter.dlq_partition == partition,
            DeadLetter.dlq_offset.between(min(offsets), max(offsets)),
        )
        for (topic, partition), offsets in spans.items()
    ]


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = rest.split("@", 1)[1]
        return f"{scheme}{sep}***@{rest}"
    return url
