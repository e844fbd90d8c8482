"""Never early on a Kafka consumer: pause a partition at its first message not yet due.

Shared by the retry consumers and the delay forwarder. A partition's fetched messages are cut
at the first one not yet due (:func:`~kmq_dagster.core.due.split_due`); the partition is rewound
to it and paused until then, and resumed by :meth:`DueGate.resume_due`. Pausing keeps the
consumer polling, so it stays in its group however long the wait.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from confluent_kafka import Consumer, TopicPartition

from kmq_dagster.core.due import split_due
from kmq_dagster.core.ranges import Source

M = TypeVar("M")


class DueGate:
    """Which partitions of ``consumer`` are paused, and until when."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        #: (topic, partition) -> when its first waiting message is due, ms since the epoch.
        self._paused: dict[Source, int] = {}

    def hold_back(
        self,
        batches: Mapping[Source, Sequence[M]],
        now_ms: int,
        due_ms_of: Callable[[M], int | None],
        offset_of: Callable[[M], int],
    ) -> list[M]:
        """The due prefix of each partition's batch; pause the rest until it is due."""
        ready: list[M] = []
        for (topic, partition), batch in batches.items():
            split = split_due(batch, now_ms, due_ms_of, offset_of)
            ready += split.ready
            if split.resume_offset is not None and split.resume_at_ms is not None:
                position = TopicPartition(topic, partition, split.resume_offset)
                self._consumer.pause([position])
                self._consumer.seek(position)
                self._paused[(topic, partition)] = split.resume_at_ms
        return ready

    def resume_due(self, now_ms: int) -> None:
        """Resume the partitions whose waiting message is due."""
        due = [source for source, due_ms in self._paused.items() if due_ms <= now_ms]
        if due:
            self._consumer.resume([TopicPartition(topic, partition) for topic, partition in due])
            for source in due:
                del self._paused[source]

    def is_paused(self, source: Source) -> bool:
        """Whether ``source`` waits for a message to become due."""
        return source in self._paused

    def next_resume_ms(self) -> int | None:
        """When the next paused partition becomes due, or ``None``."""
        return min(self._paused.values(), default=None)

    def forget(self, sources: Iterable[Source]) -> None:
        """Stop tracking revoked partitions (a new owner starts unpaused)."""
        for source in sources:
            self._paused.pop(source, None)


def group_by_source(
    messages: Iterable[M], source_of: Callable[[M], Source]
) -> dict[Source, list[M]]:
    """``messages`` per (topic, partition), order kept."""
    batches: dict[Source, list[M]] = {}
    for message in messages:
        batches.setdefault(source_of(message), []).append(message)
    return batches
