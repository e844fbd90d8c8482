"""Which fetched offsets may be committed: only those whose start markers are durable.

The consumer hands a batch out as soon as it is fetched and writes its start markers without
waiting; the batch's offsets are committed later, once the broker has acknowledged every one of
its markers (invariant 2: start before commit). Batches complete in fetch order per partition,
so a commit never passes a batch whose markers are still outstanding or failed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

Partition = tuple[str, int]


@dataclass
class _Batch:
    batch_id: int
    #: Per partition: (first offset fetched, offset after the last one fetched).
    positions: dict[Partition, tuple[int, int]]
    awaiting: int
    failed: bool = False


@dataclass
class ReadyOffsets:
    """What :meth:`CommitQueue.take_ready` found."""

    #: Offsets to commit: every batch before these positions has durable start markers.
    commit: dict[Partition, int] = field(default_factory=dict)
    #: Partitions to seek back to here: their start markers were not written, so fetch again.
    rewind: dict[Partition, int] = field(default_factory=dict)


class CommitQueue:
    """Fetched batches in order, each waiting for its start markers to be acknowledged."""

    def __init__(self) -> None:
        self._batches: deque[_Batch] = deque()
        self._by_id: dict[int, _Batch] = {}
        self._next_id = 0

    def add(self, positions: dict[Partition, tuple[int, int]], markers: int) -> int:
        """Register a batch whose ``markers`` start markers were just sent; returns its id."""
        batch = _Batch(self._next_id, dict(positions), markers)
        self._next_id += 1
        self._batches.append(batch)
        self._by_id[batch.batch_id] = batch
        return batch.batch_id

    def marker_delivered(self, batch_id: int, ok: bool) -> None:
        """The broker answered for one start marker of batch ``batch_id``."""
        batch = self._by_id.get(batch_id)
        if batch is None:  # dropped by a failure or a revocation meanwhile
            return
        batch.awaiting -= 1
        batch.failed = batch.failed or not ok

    def take_ready(self) -> ReadyOffsets:
        """Remove the finished batches at the head of the queue and say what to do."""
        ready = ReadyOffsets()
        while self._batches and self._batches[0].awaiting <= 0:
            batch = self._batches.popleft()
            del self._by_id[batch.batch_id]
            if not batch.failed:
                for partition, (_first, next_offset) in batch.positions.items():
                    if partition not in ready.rewind:
                        ready.commit[partition] = next_offset
                continue
            for partition, (first, _next) in batch.positions.items():
                ready.rewind.setdefault(partition, first)
                ready.commit.pop(partition, None)
            # Later batches of those partitions are fetched again after the rewind.
            self._drop_partitions(set(batch.positions))
        return ready

    def forget(self, partitions: set[Partition]) -> None:
        """Stop tracking ``partitions`` (revoked: their new owner starts from the commit)."""
        self._drop_partitions(partitions)

    def pending(self) -> int:
        """Batches still waiting for their start markers."""
        return len(self._batches)

    def _drop_partitions(self, partitions: set[Partition]) -> None:
        for batch in list(self._batches):
            for partition in partitions & batch.positions.keys():
                del batch.positions[partition]
            if not batch.positions:
                self._batches.remove(batch)
                del self._by_id[batch.batch_id]
