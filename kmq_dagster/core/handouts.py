"""Acknowledgements matched to the batches they were handed out in: end markers without
reading each message.

Most handlers acknowledge messages in the order they got them. The ledger remembers each
handed-out batch (its items and the offset runs they cover). When the acknowledgements drained
from a consumer's ack queue contain a whole batch, in hand-out order, the batch's runs are its
end markers: one list comparison (object identity, at C speed) replaces reading every
message's coordinates. Everything else (acks out of order, part of a batch, a batch already
forgotten) is left over, for the caller to turn into runs message by message. Either way every
acknowledged message ends up in exactly the runs it belongs to.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kmq_dagster.core.ranges import OffsetRun, Source

T = TypeVar("T")

__all__ = ["DEFAULT_CAPACITY", "HandoutLedger", "MatchedAcks", "OffsetRun", "Source"]

#: Batches remembered at most; older ones are forgotten (their acks are then matched one by
#: one). Bounds what never-acknowledged batches keep alive.
DEFAULT_CAPACITY = 64


@dataclass
class MatchedAcks(Generic[T]):
    """What :meth:`HandoutLedger.match` made of a list of acknowledged items."""

    #: Runs covering every item of the batches found whole.
    runs: list[OffsetRun] = field(default_factory=list)
    #: How many acknowledged items those runs cover.
    matched: int = 0
    #: Acknowledged items not in a whole batch, in the order given.
    leftovers: list[T] = field(default_factory=list)


class HandoutLedger(Generic[T]):
    """The batches a consumer handed out and has not yet seen acknowledged whole.

    Items must equal only themselves (object identity, as Kafka records and
    :class:`~kmq_dagster.kafka.message.KmqMessage` do). Thread-safe: batches are recorded by
    the polling thread and matched by whichever thread drains the acknowledgements.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        #: id(first item) -> (items, runs). The ledger holds the items, so an id found here
        #: can only belong to that very item.
        self._batches: dict[int, tuple[list[T], list[OffsetRun]]] = {}
        self._lock = threading.Lock()

    def record(self, items: Sequence[T], runs: list[OffsetRun]) -> None:
        """Remember that ``items`` were handed out together and cover exactly ``runs``."""
        if not items:
            return
        batch = items if isinstance(items, list) else list(items)
        with self._lock:
            self._batches[id(batch[0])] = (batch, runs)
            while len(self._batches) > self._capacity:
                del self._batches[next(iter(self._batches))]

    def match(self, acked: list[T]) -> MatchedAcks[T]:
        """Split ``acked`` into whole batches (as runs) and leftovers."""
        result: MatchedAcks[T] = MatchedAcks()
        position, total = 0, len(acked)
        with self._lock:
            batches = self._batches
            while position < total:
                batch = batches.pop(id(acked[position]), None)
                if batch is not None:
                    items, runs = batch
                    size = len(items)
                    # list == compares identity first; a handed-out item equals only itself.
                    if acked[position : position + size] == items:
                        result.runs += runs
                        result.matched += size
                        position += size
                        continue
                # Not the start of a whole batch: its acks are matched one by one.
                result.leftovers.append(acked[position])
                position += 1
        return result

    def __len__(self) -> int:
        return len(self._batches)
