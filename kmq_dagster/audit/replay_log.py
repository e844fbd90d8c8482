"""What a replay writes to the audit store as it goes, and reads back per chunk.

Intent first (see docs/design.md, "Audit before effect"): before a chunk's copies are produced,
every dead letter of it gets a replay event in state ``sending``; once the broker has
acknowledged them all, one transaction confirms them (``sent``, with where each copy went),
marks the dead letters ``replayed`` and writes the action's progress. A copy on a target topic
therefore always has an event; one whose replay died before the confirmation reads
``unconfirmed`` (it may or may not have been written), and running the same replay again
sends it again, counted as a possible duplicate, while confirmed copies are never sent twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, insert, or_, select, update

from kmq_dagster.audit.filters import at_dlq_record
from kmq_dagster.audit.history import ReplayedCopy
from kmq_dagster.audit.history_events import REPLAY
from kmq_dagster.audit.models import DeadLetter, DeadLetterEvent

if TYPE_CHECKING:
    from kmq_dagster.audit.actions import ActionRecord
    from kmq_dagster.audit.store import AuditStore

SENDING, SENT, UNCONFIRMED = "sending", "sent", "unconfirmed"

Coordinates = tuple[int, int]


@dataclass
class ChunkRecords:
    """What the store knows of a chunk's dead letters, by (partition, offset)."""

    discarded: set[Coordinates] = field(default_factory=set)
    #: (replay id, event state) of every replay event recorded against a dead letter.
    replays: dict[Coordinates, set[tuple[str, str]]] = field(
        default_factory=lambda: defaultdict(set)
    )

    #: State of the latest replay event recorded against a dead letter, whatever its replay.
    latest: dict[Coordinates, str] = field(default_factory=dict)

    def left_unconfirmed(self, coordinates: Coordinates) -> bool:
        """Whether the last copy recorded of this dead letter, by any replay, was never
        confirmed (its replay was killed or failed): a new copy may duplicate it."""
        return self.latest.get(coordinates, SENT) != SENT

    def replay_ids(self, coordinates: Coordinates) -> set[str]:
        """Every replay that sent (or may have sent) a copy of this dead letter."""
        return {replay_id for replay_id, _ in self.replays.get(coordinates, ())}

    def state(self, coordinates: Coordinates, replay_id: str) -> str | None:
        """``sent`` if ``replay_id`` has a confirmed copy of it, else ``unconfirmed`` if it may
        have one, else ``None``."""
        states = {s for r, s in self.replays.get(coordinates, ()) if r == replay_id}
        return SENT if SENT in states else (UNCONFIRMED if states else None)


def chunk_records(store: AuditStore, dlq_topic: str, offsets: dict[int, list[int]]) -> ChunkRecords:
    """Discards and replay events of the dead letters at ``offsets`` (per partition)."""
    found = ChunkRecords()
    spans = [(p, min(o), max(o)) for p, o in offsets.items() if o]
    if not spans:
        return found
    with store.engine.connect() as connection:
        events = connection.execute(
            select(
                DeadLetterEvent.dlq_partition, DeadLetterEvent.dlq_offset,
                DeadLetterEvent.detail, DeadLetterEvent.state,
            ).where(
                DeadLetterEvent.dlq_topic == dlq_topic,
                DeadLetterEvent.kind == REPLAY,
                or_(*(and_(DeadLetterEvent.dlq_partition == p,
                           DeadLetterEvent.dlq_offset.between(first, last))
                      for p, first, last in spans)),
            ).order_by(DeadLetterEvent.id)  # the last event of a dead letter is its latest
        )  # fmt: skip
        for partition, offset, replay_id, state in events:
            at = (int(partition), int(offset))
            found.replays[at].add((str(replay_id), state or SENT))
            found.latest[at] = state or SENT
    for partition, first, last in spans:
        statuses = store.statuses(dlq_topic, partition, first, last)
        found.discarded |= {(partition, o) for o, s in statuses.items() if s == "discarded"}
    return found


def record_intents(
    store: AuditStore,
    action: ActionRecord,
    dlq_topic: str,
    coordinates: Sequence[Coordinates],
    *,
    actor: str,
    replay_id: str,
) -> None:
    """A ``sending`` event per dead letter about to be copied (before the first is produced).

    Raises:
        AuditStoreError: the store refused the write: nothing of the chunk may be sent.
    """
    at = datetime.now(UTC)
    rows = [
        {"dlq_topic": dlq_topic, "dlq_partition": p, "dlq_offset": o, "kind": REPLAY, "at": at,
         "actor": actor, "detail": replay_id, "action_id": action.id, "state": SENDING}
        for p, o in coordinates
    ]  # fmt: skip
    with store.writing("record the copies about to be sent"), store.engine.begin() as connection:
        connection.execute(insert(DeadLetterEvent), rows)


def confirm_copies(
    store: AuditStore,
    action: ActionRecord,
    dlq_topic: str,
    copies: Sequence[ReplayedCopy],
    *,
    replayed: int,
    progress: str,
) -> None:
    """In one transaction: the chunk's events ``sent`` with where each copy went, its dead
    letters ``replayed``, and the action's count (``replayed`` so far) and ``progress``.

    Raises:
        AuditStoreError: the store refused the write (the events stay ``sending``).
    """
    if not copies:
        return
    where = {"action": action.id, "topic": dlq_topic}
    events = [{**where, "partition": c.dlq_partition, "offset": c.dlq_offset,
               "to_topic": c.copy_topic, "to_partition": c.copy_partition,
               "to_offset": c.copy_offset} for c in copies]  # fmt: skip
    # each row of events names its DLQ record by these keys
    record: tuple[Any, ...] = (bindparam("topic"), bindparam("partition"), bindparam("offset"))
    confirm = (
        update(DeadLetterEvent)
        .where(
            DeadLetterEvent.action_id == bindparam("action"),
            at_dlq_record(DeadLetterEvent, *record),
            DeadLetterEvent.state == SENDING,
        )
        .values(
            state=SENT,
            copy_topic=bindparam("to_topic"),
            copy_partition=bindparam("to_partition"),
            copy_offset=bindparam("to_offset"),
        )
    )
    mark = update(DeadLetter).where(at_dlq_record(DeadLetter, *record)).values(status="replayed")
    with store.writing("confirm the copies sent"), store.engine.begin() as connection:
        connection.execute(confirm, events)
        connection.execute(mark, events)
        action.progress(replayed, progress, connection)
