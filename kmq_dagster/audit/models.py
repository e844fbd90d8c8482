"""Tables of the audit store (SQLAlchemy 2, typed). Migrations in ``migrations/`` create them."""

from __future__ import annotations

from datetime import datetime

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
    pass


class DeadLetter(Base):
    """One record of a DLQ topic; (dlq_topic, dlq_partition, dlq_offset) is its identity."""

    __tablename__ = "dead_letters"
    __table_args__ = (
        UniqueConstraint("dlq_topic", "dlq_partition", "dlq_offset", name="uq_dead_letter_coords"),
        CheckConstraint(f"status IN {STATUSES}", name="ck_dead_letter_status"),
        Index("ix_dead_letters_queue", "queue_topic", "group_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dlq_topic: Mapped[str] = mapped_column(String(249))
    dlq_partition: Mapped[int] = mapped_column(Integer)
    dlq_offset: Mapped[int] = mapped_column(BigInteger)
    queue_topic: Mapped[str] = mapped_column(String(249))
    group_id: Mapped[str] = mapped_column(String(255))
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    value_size: Mapped[int] = mapped_column(Integer)
    value_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    #: ``[[name, value-as-text or null, is-base64], ...]`` in the record's order.
    headers: Mapped[list[list[object]]] = mapped_column(JSON)
    error_type: Mapped[str] = mapped_column(String(256))
    error_message: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    original_topic: Mapped[str | None] = mapped_column(String(249))
    original_partition: Mapped[int | None] = mapped_column(Integer)
    original_offset: Mapped[int | None] = mapped_column(BigInteger)
    first_failure_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_failure_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), default="new")
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Action(Base):
    """An operator action: a replay or a discard, dry run or not."""

    __tablename__ = "actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    queue_topic: Mapped[str] = mapped_column(String(249))
    group_id: Mapped[str] = mapped_column(String(255))
    selection: Mapped[str] = mapped_column(Text)
    count: Mapped[int] = mapped_column(Integer)
    target: Mapped[str | None] = mapped_column(String(249))
    dry_run: Mapped[bool] = mapped_column(Boolean)
    outcome: Mapped[str] = mapped_column(Text)


class BreakerTransition(Base):
    __tablename__ = "breaker_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    queue_topic: Mapped[str] = mapped_column(String(249))
    group_id: Mapped[str] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
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
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    queue_topic: Mapped[str] = mapped_column(String(249))
    group_id: Mapped[str] = mapped_column(String(255))
    severity: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)


class QueueSnapshot(Base):
    __tablename__ = "queue_snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    queue_topic: Mapped[str] = mapped_column(String(249))
    group_id: Mapped[str] = mapped_column(String(255))
    lag: Mapped[int] = mapped_column(BigInteger)
    inflight: Mapped[int] = mapped_column(BigInteger)
    oldest_unacked_age_ms: Mapped[int | None] = mapped_column(BigInteger)
    in_rate: Mapped[float] = mapped_column(Float)
    ack_rate: Mapped[float] = mapped_column(Float)
