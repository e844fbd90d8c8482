"""The kinds of a dead letter's history events, and the discard events the store writes.

A discard's events are written inside the store's discard transaction, so this module sits
below :mod:`kmq_dagster.audit.store`; what goes through the store (replay events, reading a
history back) is :mod:`kmq_dagster.audit.history`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert, literal, select

from kmq_dagster.audit.models import DeadLetter, DeadLetterEvent

#: Kinds of history entries: a replay or discard event, or the dead letter's own failure.
REPLAY = "replay"
DISCARD = "discard"
DEAD_LETTERED = "dead-lettered"


def record_discard_events(
    connection: Connection, selected: Any, *, actor: str, reason: str
) -> None:
    """A discard event for every dead letter ``selected`` (a condition) picks, in one
    statement; call it in the transaction that marks them discarded."""
    at = datetime.now(UTC)
    rows = select(
        DeadLetter.dlq_topic,
        DeadLetter.dlq_partition,
        DeadLetter.dlq_offset,
        literal(DISCARD),
        literal(at, DeadLetterEvent.at.type),
        literal(actor),
        literal(reason),
    ).where(selected)
    columns = ["dlq_topic", "dlq_partition", "dlq_offset", "kind", "at", "actor", "detail"]
    connection.execute(insert(DeadLetterEvent).from_select(columns, rows))
