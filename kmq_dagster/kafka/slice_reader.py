"""Reading a Spark task's slices (step 1 of docs/design.md, "The protocol", Spark variant): one
consumer for all of them, chunks of one partition each.

A task owns a few slices (a queue partition and the redelivery and retry partitions of the same
number). One consumer reads them together, so empty ones cost no extra round trip, and hands
out chunks of contiguous records of one partition. A slice ends at its partition's end (an EOF
event: never ListOffsets), at its ``max_messages``, at its first message not yet due (retry
topics: never early), or when the caller stops asking. The caller says, per chunk, how much of
it was used: only that much counts as read, and the slice resumes after it next batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby

from confluent_kafka import Message, TopicPartition

from kmq_dagster.core.due import split_due
from kmq_dagster.kafka.clients import new_consumer, wall_clock_ms
from kmq_dagster.kafka.message import due_ms_or_now, offset_of, record_offset, views_of
from kmq_dagster.kafka.topic_reader import split_fetched
from kmq_dagster.settings import KmqSettings

#: Records asked of the consumer at a time; a chunk holds at most this many. Small on purpose:
#: a chunk's records and messages are freed before ~700 new objects make Python's garbage
#: collector look at them. With 10,000 they lived through collections, were promoted, and full
#: collections took a third of a task's time (measured: 765 collections, 6 full, per 300,000
#: messages at 10,000; 3 at 500).
CHUNK_SIZE = 500
#: How long one wait for records lasts before the reader checks its slices again.
WAIT_S = 0.5

_topic_of = Message.topic
_partition_of = Message.partition


@dataclass(frozen=True)
class Slice:
    """Up to ``max_messages`` messages of one partition, from ``start_offset``."""

    topic: str
    partition: int
    start_offset: int
    max_messages: int
    #: Retry topics hold messages with due times: a slice stops at the first one not due.
    gated: bool = False

    @property
    def source(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class SliceReader:
    """Reads ``slices`` until each is done or ``stop_at`` (``time.monotonic()``) passes."""

    def __init__(self, settings: KmqSettings, slices: Sequence[Slice], stop_at: float) -> None:
        self.slices = {work.source: work for work in slices}
        #: Where each slice goes on next: the offset after its last record handed out and used.
        self.next_offset = {work.source: work.start_offset for work in slices}
        #: Records handed out and used, per slice.
        self.read = dict.fromkeys(self.slices, 0)
        self._open = {work.source for work in slices if work.max_messages > 0}
        self._stop_at = stop_at
        self._last: tuple[Slice, list[Message]] | None = None
        self._consumer = new_consumer(
            settings, f"kmq-spark-reader-{uuid.uuid4().hex}", **{"enable.partition.eof": True}
        )
        self._consumer.assign(
            [TopicPartition(w.topic, w.partition, w.start_offset) for w in slices
             if w.source in self._open]
        )  # fmt: skip

    def chunks(self) -> Iterator[tuple[Slice, list[Message]]]:
        """Chunks of one slice's records, in offset order, until every slice is done or time
        is up. Each counts as used whole unless :meth:`used` says otherwise."""
        while self._open and time.monotonic() < self._stop_at:
            fetched = self._consumer.consume(CHUNK_SIZE, 0) or self._consumer.consume(
                CHUNK_SIZE, WAIT_S
            )
            ended: list[tuple[str, int]] = []
            if fetched and any(map(Message.error, fetched)):
                fetched, ended = split_fetched(fetched)
            for source, stretch in _by_source(fetched):
                if source not in self._open:
                    continue  # the slice ended; the rest is read again next batch
                work = self.slices[source]
                records = stretch[: work.max_messages - self.read[source]]
                if work.gated:
                    records = self._due_prefix(source, records)
                if records:
                    self._hand_out(work, records)
                    yield work, records
            for source in ended:
                self._end(source)

    def used(self, count: int) -> None:
        """Only the first ``count`` records of the chunk just handed out were used: the slice
        ends after them, and the rest is read again next batch."""
        assert self._last is not None, "used() refers to the chunk chunks() just handed out"
        work, records = self._last
        if count < len(records):
            self.read[work.source] -= len(records) - count
            self.next_offset[work.source] = (
                record_offset(records[count - 1]) + 1 if count else record_offset(records[0])
            )
            self._end(work.source)

    def close(self) -> None:
        self._consumer.close()

    def _hand_out(self, work: Slice, records: list[Message]) -> None:
        self._last = (work, records)
        self.read[work.source] += len(records)
        self.next_offset[work.source] = record_offset(records[-1]) + 1
        if self.read[work.source] >= work.max_messages:
            self._end(work.source)

    def _due_prefix(self, source: tuple[str, int], records: list[Message]) -> list[Message]:
        """Never early: the slice ends at its first message not yet due."""
        ready = split_due(views_of(records), wall_clock_ms(), due_ms_or_now, offset_of).ready
        if len(ready) < len(records):
            self._end(source)
        return records[: len(ready)]

    def _end(self, source: tuple[str, int]) -> None:
        if source in self._open:
            self._open.discard(source)
            self._consumer.pause([TopicPartition(*source)])


def _by_source(records: list[Message]) -> Iterator[tuple[tuple[str, int], list[Message]]]:
    """Split fetched records into stretches of one partition (usually one stretch)."""
    if not records:
        return
    topics = list(map(_topic_of, records))
    partitions = list(map(_partition_of, records))
    size = len(records)
    if topics.count(topics[0]) == size and partitions.count(partitions[0]) == size:
        yield (topics[0] or "", partitions[0] or 0), records
        return
    start = 0
    for (topic, partition), stretch in groupby(zip(topics, partitions, strict=True)):
        end = start + sum(1 for _ in stretch)
        yield (topic or "", partition or 0), records[start:end]
        start = end
