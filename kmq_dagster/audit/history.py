"""The history of a dead letter: when it failed, every replay and discard of it (by whom), and
what became of each replayed copy.

A message can be dead-lettered, replayed and dead-lettered again: every dead letter of one
group with the same original coordinates (``kmq-original-*`` headers, kept across every hop)
is the same message, so its history spans all of them. Events are keyed by DLQ coordinates,
so a replay recorded before its dead letter was ingested still shows once it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import or_, select

from kmq_dagster.audit.filters import at_dlq_record
from kmq_dagster.audit.history_events import DEAD_LETTERED, REPLAY
from kmq_dagster.audit.models import DeadLetter, DeadLetterEvent, as_utc

if TYPE_CHECKING:
    from kmq_dagster.audit.store import AuditStore


@dataclass(frozen=True)
class ReplayedCopy:
    """One dead letter replayed: its DLQ coordinates and where its copy was written."""

    dlq_partition: int
    dlq_offset: int
    copy_topic: str
    copy_partition: int
    copy_offset: int


@dataclass(frozen=True)
class HistoryEntry:
    """One step in a message's life, oldest first."""

    at: datetime
    kind: str
    #: The dead letter this step belongs to.
    dead_letter_id: int | None
    actor: str | None
    #: Reason (dead-lettered, discard) or replay id.
    detail: str
    copy_topic: str | None = None
    copy_partition: int | None = None
    copy_offset: int | None = None
    #: A replayed copy that failed again: the dead letter it became.
    came_back_as: int | None = None


def same_message(store: AuditStore, dead_letter: DeadLetter) -> list[DeadLetter]:
    """Every stored dead letter of the same message and group, oldest first (at least
    ``dead_letter`` itself)."""
    if dead_letter.original_topic is None or dead_letter.original_offset is None:
        return [dead_letter]
    query = (
        select(DeadLetter)
        .where(
            DeadLetter.original_topic == dead_letter.original_topic,
            DeadLetter.original_partition == dead_letter.original_partition,
            DeadLetter.original_offset == dead_letter.original_offset,
            DeadLetter.group_id == dead_letter.group_id,
        )
        .order_by(DeadLetter.last_failure_at, DeadLetter.id)
    )
    with store.session() as session:
        return list(session.scalars(query)) or [dead_letter]


def history(store: AuditStore, dead_letter: DeadLetter) -> list[HistoryEntry]:
    """The life of ``dead_letter``'s message: failures, replays, discards, oldest first."""
    letters = same_message(store, dead_letter)
    by_coordinates = {(d.dlq_topic, d.dlq_partition, d.dlq_offset): d for d in letters}
    events_query = (
        select(DeadLetterEvent)
        .where(or_(*(
            at_dlq_record(DeadLetterEvent, topic, partition, offset)
            for topic, partition, offset in by_coordinates
        )))
        .order_by(DeadLetterEvent.at, DeadLetterEvent.id)
    )  # fmt: skip
    with store.session() as session:
        events = list(session.scalars(events_query))
    entries = [
        HistoryEntry(as_utc(d.last_failure_at), DEAD_LETTERED, d.id, None, d.reason)
        for d in letters
    ]
    for event in events:
        owner = by_coordinates[(event.dlq_topic, event.dlq_partition, event.dlq_offset)]
        came_back = None
        if event.kind == REPLAY:
            later = [d for d in letters if as_utc(d.last_failure_at) > as_utc(event.at)]
            came_back = later[0].id if later else None
        entries.append(
            HistoryEntry(
                as_utc(event.at), event.kind, owner.id, event.actor, event.detail,
                event.copy_topic, event.copy_partition, event.copy_offset, came_back,
            )
        )  # fmt: skip
    return sorted(entries, key=lambda entry: entry.at)
