"""Step 7 of the protocol (docs/design.md): overdue messages copied, then ended.

For each overdue message of a markers partition: read the original record at its exact
offset, produce a copy to the group's redelivery topic (or, past ``max_redeliveries``, to the
group's DLQ with the reason), wait for the broker's acknowledgement of every copy, then write
end markers for the old messages. The redelivery tracker (``kafka.redelivery_tracker``) reads
the markers and decides what is overdue. A copy refused for its size is dead-lettered as a
reference instead (``kafka.oversize``), and its message is ended only once that is durable.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict

from confluent_kafka import KafkaError, KafkaException, Message

from kmq_dagster.core.headers import (
    DLQ_REASON,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP_MS,
    ORIGINAL_TOPIC,
    REDELIVERY_COUNT,
    header_value,
    int_header,
)
from kmq_dagster.core.inflight import MessageRef
from kmq_dagster.core.oversize import ValueRef
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.ranges import OffsetRun, offset_runs
from kmq_dagster.core.wording import counted
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import COPY_ANSWER_TIMEOUT_S, DELIVERY_TIMEOUT_S, DeliveryTally
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.oversize import References, RefusedCopy, is_size_refusal, size_refusal
from kmq_dagster.kafka.record_reader import RecordReader
from kmq_dagster.kafka.tracker_state import MarkersPartitionState, TrackerStats
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import copied_headers, tracing_active

# The tracker's log: an operator reads the tracker's lines under one logger name.
log = logging.getLogger("kmq_dagster.kafka.redelivery_tracker")

#: Reads of a record that neither find it nor rule it out before it counts as gone.
MAX_UNDECIDED_READS = 3


class Redeliverer:
    """Copies overdue messages of ``queue`` and ends them (see the module docstring)."""

    def __init__(self, settings: KmqSettings, queue: Queue, stats: TrackerStats) -> None:
        self.redelivery_topic = queue.redelivery_topic
        self.dlq_topic = queue.dlq_topic
        #: Partitions of the redelivery topic and the DLQ (the queue's auxiliary count).
        self.aux_partitions = queue.aux_partition_count or 1
        self.max_redeliveries = queue.max_redeliveries
        self._group_bytes = queue.group.encode()
        self._stats = stats
        self._producer = new_producer(settings)
        self._markers = MarkerWriter(settings, queue.markers_topic, producer=self._producer)
        self._reader = RecordReader(settings, f"kmq-tracker-reader.{queue.topic}.{queue.group}")

    def redeliver(
        self, markers_partition: int, state: MarkersPartitionState, refs: list[MessageRef]
    ) -> int:
        """7. Copy the messages ``refs`` name, then end them; returns how many were ended
        (0 when the broker did not acknowledge every copy: all stay in flight)."""
        by_source: dict[tuple[str, int], list[int]] = defaultdict(list)
        for ref in refs:
            by_source[(ref.topic, ref.partition)].append(ref.offset)
        done: dict[tuple[str, int], list[int]] = defaultdict(list)
        # Copies refused for their size: by the client at once, by the broker in its answer.
        refused: list[RefusedCopy] = []
        refused_later: list[RefusedCopy] = []
        copies = DeliveryTally(
            self._producer, on_error=functools.partial(_note_size_refusal, refused_later)
        )
        for (topic, partition), offsets in by_source.items():
            read = self._reader.read(topic, partition, offsets)
            ended = done[(topic, partition)]
            for offset, record in sorted(read.found.items()):
                self._produce_copy(record, copies, refused, refused_later)
                ended.append(offset)
            for offset in read.gone:
                self._record_gone(MessageRef(topic, partition, offset))
                ended.append(offset)
            for offset in read.undecided:
                ref = MessageRef(topic, partition, offset)
                state.undecided_reads[ref] += 1
                if state.undecided_reads[ref] >= MAX_UNDECIDED_READS:
                    del state.undecided_reads[ref]
                    self._record_gone(ref)
                    ended.append(offset)
        copies.all_delivered(COPY_ANSWER_TIMEOUT_S)
        if not self._references_delivered(refused, refused_later, copies):
            # Nothing is ended: every message stays in flight and is tried again next check.
            self._stats.produce_failures += 1
            failures = [error.str() for error in copies.errors[:1]] or "no answer in time"
            log.warning("redelivery not acknowledged by the broker; will retry: %s", failures)
            return 0
        # One end marker per contiguous run: a chunk of a backlog is a few markers, not one
        # per message for every tracker to read back. Written where the start markers were read.
        runs: list[OffsetRun] = [
            (source, first, count)
            for source, offsets in done.items()
            for first, count in offset_runs(offsets)
        ]
        for end in self._markers.end(runs, markers_partition):
            state.inflight.record_end(end)
        self._markers.serve()
        return sum(len(offsets) for offsets in done.values())

    def _references_delivered(
        self, refused: list[RefusedCopy], refused_later: list[RefusedCopy], copies: DeliveryTally
    ) -> bool:
        """Dead-letter a reference for each copy refused for its size (``kafka.oversize``);
        True if the broker acknowledged every other copy and every reference."""
        if copies.delivered + len(refused_later) != copies.produced:
            return False
        for copy in refused_later:  # counted as copied when produced
            if copy.target == self.redelivery_topic:
                self._stats.redelivered -= 1
                self._stats.dead_lettered += 1
        references: References[None] = References(self._producer, self.dlq_topic)
        for copy in refused + refused_later:
            references.write(None, copy)
        self._stats.oversize += references.refused
        return len(references.delivered()) == len(refused) + len(refused_later)

    def _produce_copy(
        self,
        record: Message,
        copies: DeliveryTally,
        refused: list[RefusedCopy],
        refused_later: list[RefusedCopy],
    ) -> None:
        # On the path of every redelivered message: a backlog of a million moves through here.
        # The client hands headers out as (str, bytes | None) pairs already.
        headers: list[tuple[str, bytes | None]] = record.headers() or []  # type: ignore[assignment]
        target = self.redelivery_topic
        try:
            count = (int_header(headers, REDELIVERY_COUNT) or 0) + 1 if headers else 1
        except ValueError as exc:
            target = self.dlq_topic
            tail: list[tuple[str, bytes | None]] = [
                (DLQ_REASON, f"corrupt redelivery metadata: {exc}".encode())
            ]
        else:
            tail = [(REDELIVERY_COUNT, b"1" if count == 1 else str(count).encode())]
            if count > self.max_redeliveries:
                target = self.dlq_topic
                reason = "not acknowledged within its visibility timeout after " + counted(
                    self.max_redeliveries, "redelivery", "redeliveries"
                )
                tail.append((DLQ_REASON, reason.encode()))
        copy_headers = self._copy_headers(record, headers, tail)
        if tracing_active():
            copy_headers = self._traced(record, target, headers, copy_headers)
        # the message's partition, folded into the target's count (Queue.partition_for)
        partition = (record.partition() or 0) % self.aux_partitions
        try:
            copies.produce(
                target,
                key=record.key(),
                value=record.value(),
                headers=copy_headers,
                partition=partition,
            )
        except KafkaException as exc:
            refusal = size_refusal(exc)  # the client's limit
            if refusal is None:
                raise
            source = ValueRef(record.topic() or "", record.partition() or 0, record.offset() or 0)
            refused.append(
                RefusedCopy(
                    source,
                    target,
                    record.key(),
                    record.value(),
                    copy_headers,
                    partition,
                    refusal,
                )
            )
            self._stats.dead_lettered += 1
            return
        if target == self.dlq_topic:
            self._stats.dead_lettered += 1
        else:
            self._stats.redelivered += 1

    def _copy_headers(
        self,
        record: Message,
        headers: list[tuple[str, bytes | None]],
        tail: list[tuple[str, bytes | None]],
    ) -> list[tuple[str, bytes | None]]:
        """The headers of ``record``'s copy: its user headers, in order, then the group, where
        the message was first produced (kept as they are if ``record`` is a copy already), then
        ``tail``; a kmq header set here replaces the record's own."""
        kmq: list[tuple[str, bytes | None]] = [(GROUP, self._group_bytes)]
        if not any(key == ORIGINAL_TOPIC for key, _ in headers):
            kmq += [
                (ORIGINAL_TOPIC, (record.topic() or "").encode()),
                (ORIGINAL_PARTITION, str(record.partition()).encode()),
                (ORIGINAL_OFFSET, str(record.offset()).encode()),
                (ORIGINAL_TIMESTAMP_MS, str(record.timestamp()[1]).encode()),
            ]
        kmq += tail
        if not headers:  # the common case: a first redelivery of a message without headers
            return kmq
        replaced = {key for key, _ in kmq}
        return [(key, value) for key, value in headers if key not in replaced] + kmq

    def _traced(
        self,
        record: Message,
        target: str,
        headers: list[tuple[str, bytes | None]],
        copy_headers: list[tuple[str, bytes | None]],
    ) -> list[tuple[str, bytes | None]]:
        """``copy_headers`` with the trace context of a ``redeliver`` or ``dead-letter`` span."""
        operation = "dead-letter" if target == self.dlq_topic else "redeliver"
        source = (record.topic() or "", record.partition() or 0, record.offset() or 0)
        attributes = {"messaging.consumer.group.name": self._group_bytes.decode()}
        return copied_headers(
            operation, target, copy_headers, source=source, source_headers=headers,
            attributes=attributes,
        )  # fmt: skip

    def _record_gone(self, ref: MessageRef) -> None:
        self._stats.records_gone += 1
        log.warning("cannot redeliver %s: the record is not in the log; ending it", ref)

    def close(self) -> None:
        """Let the record reader go and flush the producer."""
        self._reader.close()
        self._producer.flush(DELIVERY_TIMEOUT_S)


def _note_size_refusal(refused: list[RefusedCopy], error: KafkaError, copy: Message) -> None:
    """A copy the broker refused for its size (its limit, in its answer) becomes a
    :class:`RefusedCopy` referring to where the message was first produced: its copies carry
    the same value byte for byte, and the copy's headers name that record. One shared
    callback for every copy, so nothing is kept per record in flight (a chunk may hold 100k)."""
    if not is_size_refusal(error):
        return
    headers: list[tuple[str, bytes | None]] = copy.headers() or []  # type: ignore[assignment]
    source = ValueRef(
        (header_value(headers, ORIGINAL_TOPIC) or b"").decode("utf-8", "replace"),
        int_header(headers, ORIGINAL_PARTITION) or 0,
        int_header(headers, ORIGINAL_OFFSET) or 0,
    )
    refused.append(
        RefusedCopy(
            source,
            copy.topic() or "",
            copy.key(),
            copy.value(),
            headers,
            copy.partition() or 0,
            error,
        )
    )
