"""Read-only queries of the Overview, Actions and Breakers & alerts pages.

Queue snapshots (lag, in flight, oldest unacknowledged age, rates) are written by the Dagster
observation sensor; until it runs there are none, and the Overview says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Integer, cast, func, select

from kmq_dagster.audit.models import (
    Action,
    Alert,
    BreakerState,
    BreakerTransition,
    DeadLetter,
    QueueSnapshot,
    as_utc,
)

if TYPE_CHECKING:
    from kmq_dagster.audit.store import AuditStore

Queue = tuple[str, str]


@dataclass
class QueueSummary:
    """One queue topic and group, as the Overview shows it."""

    queue_topic: str
    group_id: str
    dead_letters: dict[str, int] = field(default_factory=dict)
    snapshot: QueueSnapshot | None = None
    breaker_state: str | None = None
    breaker_since: datetime | None = None


def queue_summaries(store: AuditStore) -> list[QueueSummary]:
    """Every queue and group that has dead letters, snapshots or a breaker."""
    found: dict[Queue, QueueSummary] = {}

    def summary(topic: str, group: str) -> QueueSummary:
        return found.setdefault((topic, group), QueueSummary(topic, group))

    counts = select(
        DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.status, func.count()
    ).group_by(DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.status)
    with store.engine.connect() as connection:
        for topic, group, status, count in connection.execute(counts):
            summary(topic, group).dead_letters[status] = int(count)
    for snapshot in newest_snapshots(store):
        summary(snapshot.queue_topic, snapshot.group_id).snapshot = snapshot
    for state, since in breakers(store):
        entry = summary(state.queue_topic, state.group_id)
        entry.breaker_state, entry.breaker_since = state.state, since
    return [found[queue] for queue in sorted(found)]


def newest_snapshots(store: AuditStore) -> list[QueueSnapshot]:
    """The newest snapshot of each queue and group."""
    newest = (
        select(func.max(QueueSnapshot.id))
        .group_by(QueueSnapshot.queue_topic, QueueSnapshot.group_id)
        .scalar_subquery()
    )
    query = select(QueueSnapshot).where(QueueSnapshot.id.in_(newest))
    with store.session() as session:
        return list(session.scalars(query))


def snapshot_series(store: AuditStore, since: datetime) -> list[dict[str, Any]]:
    """Snapshots since ``since``, oldest first: time, queue, lag, in flight."""
    query = (
        select(QueueSnapshot)
        .where(QueueSnapshot.at >= since)
        .order_by(QueueSnapshot.at, QueueSnapshot.id)
    )
    with store.session() as session:
        return [
            {"at": as_utc(s.at), "queue": f"{s.queue_topic} / {s.group_id}", "lag": s.lag,
             "in flight": s.inflight}
            for s in session.scalars(query)
        ]  # fmt: skip


def arrivals(store: AuditStore, since: datetime, bucket_s: int) -> list[dict[str, Any]]:
    """Dead letters per ``bucket_s`` seconds since ``since`` (by last failure), per queue."""
    if store.engine.dialect.name == "postgresql":
        epoch = cast(func.floor(func.extract("epoch", DeadLetter.last_failure_at)), BigInteger)
    else:
        epoch = cast(func.strftime("%s", DeadLetter.last_failure_at), Integer)
    bucket = ((epoch // bucket_s) * bucket_s).label("bucket")
    query = (
        select(bucket, DeadLetter.queue_topic, DeadLetter.group_id, func.count())
        .where(DeadLetter.last_failure_at >= since)
        .group_by(bucket, DeadLetter.queue_topic, DeadLetter.group_id)
        .order_by(bucket)
    )
    with store.engine.connect() as connection:
        return [
            {"at": datetime.fromtimestamp(int(start), UTC), "queue": f"{topic} / {group}",
             "dead letters": int(count)}
            for start, topic, group, count in connection.execute(query)
        ]  # fmt: skip


def breakers(store: AuditStore) -> list[tuple[BreakerState, datetime | None]]:
    """Every shared breaker with the time of its last transition (``None``: none recorded)."""
    latest = (
        select(
            BreakerTransition.queue_topic,
            BreakerTransition.group_id,
            func.max(BreakerTransition.at).label("since"),
        )
        .group_by(BreakerTransition.queue_topic, BreakerTransition.group_id)
        .subquery()
    )
    query = (
        select(BreakerState, latest.c.since)
        .outerjoin(
            latest,
            (latest.c.queue_topic == BreakerState.queue_topic)
            & (latest.c.group_id == BreakerState.group_id),
        )
        .order_by(BreakerState.queue_topic, BreakerState.group_id)
    )
    with store.session() as session:
        rows = session.execute(query).all()
    return [(state, as_utc(since) if since else None) for state, since in rows]


def recent_transitions(store: AuditStore, limit: int = 200) -> list[BreakerTransition]:
    query = select(BreakerTransition).order_by(BreakerTransition.id.desc()).limit(limit)
    with store.session() as session:
        return list(session.scalars(query))


def recent_alerts(store: AuditStore, limit: int = 200) -> list[Alert]:
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    with store.session() as session:
        return list(session.scalars(query))


def recent_actions(
    store: AuditStore, *, limit: int = 200, kind: str | None = None, actor: str | None = None
) -> list[Action]:
    """Operator actions, newest first, optionally of one kind or actor; one whose process is
    gone reads ``interrupted``."""
    store.reap_abandoned_actions()
    query = select(Action).order_by(Action.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(Action.kind == kind)
    if actor is not None:
        query = query.where(Action.actor == actor)
    with store.session() as session:
        return list(session.scalars(query))
