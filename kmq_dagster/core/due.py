"""Never early: which fetched messages of a partition may run now, and where to pause.

Messages of one retry-topic partition are roughly in due order, but not exactly (jitter, clock
steps). A consumer processes a partition's messages in order up to the first one that is not
due, then pauses that partition, rewound to it, until it is due. Messages after it wait too,
even if due: they are fetched again, later rather than early.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

M = TypeVar("M")


@dataclass(frozen=True)
class DueSplit(Generic[M]):
    """The due prefix of a partition's batch, and where to resume if something is not due."""

    ready: list[M]
    #: Offset to rewind to and pause at, or ``None`` when every message was due.
    resume_offset: int | None = None
    #: When the first waiting message is due (ms since the epoch), or ``None``.
    resume_at_ms: int | None = None


def split_due(
    messages: Sequence[M],
    now_ms: int,
    due_ms_of: Callable[[M], int | None],
    offset_of: Callable[[M], int],
) -> DueSplit[M]:
    """Split one partition's messages (in offset order) at the first one not yet due.

    A message without a due time is due now.
    """
    for index, message in enumerate(messages):
        due_ms = due_ms_of(message)
        if due_ms is not None and due_ms > now_ms:
            return DueSplit(list(messages[:index]), offset_of(message), due_ms)
    return DueSplit(list(messages))
