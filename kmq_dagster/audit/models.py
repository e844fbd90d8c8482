"""Tables of the audit store (SQLAlchemy 2, typed). Migrations in ``migrations/`` create them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import JSON

#: Dead-letter values longer than this are stored cut, with ``value_truncated`` set.
MAX_STORED_VALUE_BYTES = 64 * 1024
STATUSES = ("new", "replayed", "discarded")


class Base(DeclarativeBase):
    # Every moment is stored with its time zone.
    type_annotation_map = {datetime: DateTime(timezone=True)}


#: A Kafka topic name (249 characters at most) and a consumer group id, as columns.
TopicName = Annotated[str, mapped_column(String(249))]
GroupId = Annotated[str, mapped_column(String(255))]


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC); PostgreSQL aware ones."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class DeadLetter(Base):
    """One record of a DLQ topic; (dlq_topic, dlq_partition, dlq_offset) is its identity."""

    __tablename__ = "dead_letters"
    __table_args__ = (
        UniqueConstraint("dlq_topic", "dlq_partition", "dlq_offset", name="uq_dead_letter_coords"),
        CheckConstraint(f"status IN {STATUSES}", name="ck_dead_letter_status"),
        Index("ix_dead_letters_queue", "queue_topic", "group_id", "status"),
        # The console's browsing paths (migration 0003): newest first per queue, per cause and
        # overall; lookups by key and by original coordinates (a message's history). Each
        # index costs ingest time: a status is filtered while walking the queue's index.
        Index("ix_dead_letters_browse", "queue_topic", "group_id", "last_failure_at", "id"),
        Index(
            "ix_dead_letters_cause",
            "queue_topic", "group_id", "error_type", "error_pattern", "status", "last_failure_at",
        ),
        Index("ix_dead_letters_time", "last_failure_at", "id"),
        # Hash on PostgreSQL: a B-tree refuses keys over ~2,700 bytes, and Kafka keys may be.
        Index("ix_dead_letters_key", "key", postgresql_using="hash"),
        Index(
            "ix_dead_letters_original",
            "original_topic", "original_partition", "original_offset",
        ),
    )  # fmt: skip

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dlq_topic: Mapped[TopicName]
    dlq_partition: Mapped[int] = mapped_column(Integer)
    dlq_offset: Mapped[int] = mapped_column(BigInteger)
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    value_size: Mapped[int] = mapped_column(Integer)
    value_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    #: ``[[name, value-as-text or null, is-base64], ...]`` in the record's order.
    headers: Mapped[list[list[object]]] = mapped_column(JSON)
    error_type: Mapped[str] = mapped_column(String(256))
    error_message: Mapped[str] = mapped_column(Text)
    #: The error message with ids, numbers and times replaced: what "the same cause" means.
    error_pattern: Mapped[str] = mapped_column(String(400), default="")
    reason: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    original_topic: Mapped[str | None] = mapped_column(String(249))
    original_partition: Mapped[int | None] = mapped_column(Integer)
    original_offset: Mapped[int | None] = mapped_column(BigInteger)
    first_failure_at: Mapped[datetime]
    last_failure_at: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16), default="new")
    ingested_at: Mapped[datetime]
    # A Schema Registry value (migration 0005; see kmq_dagster.audit.stored_values): ``value``
    # then holds its decoded, masked JSON; all empty for any other value.
    #: ``avro``, ``protobuf`` or ``json-schema`` (empty when unknown or not framed).
    value_format: Mapped[str | None] = mapped_column(String(16), default=None)
    schema_id: Mapped[int | None] = mapped_column(Integer, default=None)
    schema_subject: Mapped[str | None] = mapped_column(String(255), default=None)
    schema_version: Mapped[int | None] = mapped_column(Integer, default=None)
    #: Why a framed value could not be decoded (``value`` then holds its bytes).
    value_undecodable: Mapped[str | None] = mapped_column(Text, default=None)


#: An action's states: running (its owner heartbeats ``expires_at``), then one of the others.
#: ``interrupted``: its process died (SIGKILL, power loss); found and written by the next look.
ACTION_STATES = ("running", "succeeded", "failed", "stopped", "interrupted")


class Action(Base):
    """An operator action: a replay, discard, ingest or retention, dry run or not.

    Written as ``running`` before the action's first effect (``at`` is when it started) and
    finished with its counts and outcome however it ends (see ``kmq_dagster.audit.actions``).
    """

    __tablename__ = "actions"
    __table_args__ = (Index("ix_actions_state", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255))
    at: Mapped[datetime]
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    selection: Mapped[str] = mapped_column(Text)
    count: Mapped[int] = mapped_column(Integer)
    target: Mapped[str | None] = mapped_column(String(249))
    dry_run: Mapped[bool] = mapped_column(Boolean)
    outcome: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="succeeded")
    finished_at: Mapped[datetime | None]
    #: ``host:pid`` of the process running it.
    owner: Mapped[str | None] = mapped_column(String(255))
    #: While running: the owner's heartbeat reaches this far; past it, the owner is gone.
    expires_at: Mapped[datetime | None]


class ActionLease(Base):
    """The lease a running action holds on the dead letters of a queue and group (``*``: all):
    actions on overlapping dead letters run one after the other. A lease whose action is no
    longer running (or whose owner is gone) is free. The row of ``action_id`` 0 is a guard
    that every acquisition updates first, so acquisitions are serialized on SQLite and
    PostgreSQL alike."""

    __tablename__ = "action_leases"

    action_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    acquired_at: Mapped[datetime]


class BreakerTransition(Base):
    __tablename__ = "breaker_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    at: Mapped[datetime]
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    error_rate: Mapped[float] = mapped_column(Float)
    window_calls: Mapped[int] = mapped_column(Integer)
    window_ms: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)


class BreakerState(Base):
    """The shared state of one breaker: every worker process of the group reads and writes it."""

    __tablename__ = "breaker_states"

    queue_topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    opened_at_ms: Mapped[int] = mapped_column(BigInteger)
    cooldown_ms: Mapped[int] = mapped_column(BigInteger)
    #: Bumped on every write; a write names the version it read (compare-and-set).
    version: Mapped[int] = mapped_column(Integer)


class Alert(Base):
    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    severity: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)


class QueueSnapshot(Base):
    __tablename__ = "queue_snapshots"
    __table_args__ = (Index("ix_queue_snapshots_queue", "queue_topic", "group_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    queue_topic: Mapped[TopicName]
    group_id: Mapped[GroupId]
    lag: Mapped[int] = mapped_column(BigInteger)
    inflight: Mapped[int] = mapped_column(BigInteger)
    oldest_unacked_age_ms: Mapped[int | None] = mapped_column(BigInteger)
    in_rate: Mapped[float] = mapped_column(Float)
    ack_rate: Mapped[float] = mapped_column(Float)


class DeadLetterHeader(Base):
    """One user header (not ``kmq-*``) of a dead letter, for the console's name=value filter.

    The value is kept as a SHA-256 digest: exact matches of any length, and one narrow index.
    """

    __tablename__ = "dead_letter_headers"
    __table_args__ = (Index("ix_dead_letter_headers_lookup", "name", "value_sha256"),)

    dead_letter_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    #: Hex digest of the raw value; ``None`` for a header without a value.
    value_sha256: Mapped[str | None] = mapped_column(String(64))


class DeadLetterSearch(Base):
    """What the console's substring filters scan for one dead letter: narrow, unlike
    ``dead_letters`` rows (see :mod:`kmq_dagster.audit.indexing`)."""

    __tablename__ = "dead_letter_search"

    dead_letter_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The start of the value as UTF-8 text, a newline, the error message.
    body: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)


class DeadLetterEvent(Base):
    """A replay or discard of one dead letter: its history, keyed by its DLQ coordinates so a
    replay recorded before the dead letter was ingested still finds it."""

    __tablename__ = "dead_letter_events"
    __table_args__ = (
        Index("ix_dead_letter_events_coords", "dlq_topic", "dlq_partition", "dlq_offset"),
        Index("ix_dead_letter_events_action", "action_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dlq_topic: Mapped[TopicName]
    dlq_partition: Mapped[int] = mapped_column(Integer)
    dlq_offset: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(255))
    #: The discard's reason, or the replay's id.
    detail: Mapped[str] = mapped_column(Text)
    #: Where the replayed copy was written (replays only).
    copy_topic: Mapped[str | None] = mapped_column(String(249))
    copy_partition: Mapped[int | None] = mapped_column(Integer)
    copy_offset: Mapped[int | None] = mapped_column(BigInteger)
    #: The action that wrote it (migration 0004 on; ``None`` before).
    action_id: Mapped[int | None] = mapped_column(Integer)
    #: A replay's copy: ``sending`` (recorded before it is produced), ``sent`` (acknowledged
    #: by the broker, where it went is known) or ``unconfirmed`` (its replay ended before the
    #: acknowledgement: the copy may be on the target topic). ``None``: a discard.
    state: Mapped[str | None] = mapped_column(String(16))
