"""The redelivery tracker: reads a group's markers and redelivers what was not acknowledged.

Steps 5-8 of docs/design.md, "The protocol" (the code repeats the numbers), per markers
partition it owns:
  5. on assignment, resume from the committed markers offset (the smallest marker that still
     had an unacknowledged message when it was committed) and rebuild in-flight state;
  6. redeliver nothing until the partition has been read to its end (a partition-EOF event),
     so a restarted tracker never redelivers what was acknowledged after its commit
     (invariant 5);
  7. for each overdue message: read the original record at its exact offset, produce a copy to
     the group's redelivery topic (or, past ``max_redeliveries``, to the group's DLQ with the
     reason), wait for the broker's acknowledgement, then write the old message's end marker;
  8. commit the smallest open marker offset, so recovery re-reads only what may still be open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kmq_dagster.core.headers import (
    DLQ_REASON,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP_MS,
    ORIGINAL_TOPIC,
    REDELIVERY_COUNT,
    int_header,
)
from kmq_dagster.core.inflight import MessageRef, PartitionInflight
from kmq_dagster.core.markers import StartMarker, decode_marker
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.ranges import OffsetRun, offset_runs
from kmq_dagster.errors import MarkerDecodeError
from kmq_dagster.kafka.clients import ClientErrors, new_consumer, new_producer, wall_clock_ms
from kmq_dagster.kafka.delivery import (
    COPY_ANSWER_TIMEOUT_S,
    DELIVERY_TIMEOUT_S,
    DeliveryTally,
)
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.record_reader import FETCH_MAX_BYTES, RecordReader

log = logging.getLogger(__name__)

#: How often overdue messages are looked for.
CHECK_INTERVAL_S = 0.1
#: How often the smallest open marker offset is committed.
COMMIT_INTERVAL_S = 1.0
#: Reads of a record that neither find it nor rule it out before it counts as gone.
MAX_UNDECIDED_READS = 3
#: Most messages of one markers partition redelivered in one step: a backlog of a million
#: overdue messages moves in bounded chunks, so the tracker's memory stays bounded too.
REDELIVERY_CHUNK = 5_000
#: Prefetch bounds of the markers consumer (see __init__).
MARKERS_PREFETCH_MESSAGES = 20_000
MARKERS_PREFETCH_KBYTES = 8_192


@dataclass
class TrackerStats:
    """Counters an operator or a test reads; never reset."""

    markers: int = 0
    bad_markers: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    records_gone: int = 0
    produce_failures: int = 0
    client_errors: ClientErrors = field(default_factory=ClientErrors)
    #: Unacknowledged messages of the owned partitions, as of the last commit (each second).
    in_flight: int = 0
    #: Deadline of the oldest open start marker, as of the last commit; ``None``: none open.
    oldest_open_deadline_ms: int | None = None


@dataclass
class _PartitionState:
    inflight: PartitionInflight = field(default_factory=PartitionInflight)
    caught_up: bool = False
    next_offset: int | None = None
    undecided_reads: dict[MessageRef, int] = field(default_factory=lambda: defaultdict(int))


def tracker_group(queue: Queue) -> str:
    """The consumer group the trackers of ``queue`` share the markers partitions in."""
    return f"kmq-tracker.{queue.topic}.{queue.group}"


class RedeliveryTracker:
    """Redelivers ``queue``'s messages that were not acknowledged within their visibility
    timeout; several may run side by side (they share the markers partitions).

    Examples:
        >>> tracker = RedeliveryTracker(open_queue(settings, "orders", "billing"))
        ...                                                   # doctest: +SKIP
        >>> tracker.run(stop_event)                           # doctest: +SKIP
    """

    def __init__(
        self,
        opened: OpenedQueue,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.opened = opened
        self.queue = queue = opened.queue
        settings = opened.settings
        self.topic = queue.topic
        self.group = queue.group
        self.max_redeliveries = queue.max_redeliveries
        self.markers_topic = queue.markers_topic
        self.redelivery_topic = queue.redelivery_topic
        self.dlq_topic = queue.dlq_topic
        self._group_bytes = queue.group.encode()
        self.stats = TrackerStats()
        self._clock_ms = clock_ms
        self._partitions: dict[int, _PartitionState] = {}
        self._consumer = new_consumer(
            settings,
            tracker_group(queue),
            **{
                "enable.partition.eof": True,
                "error_cb": self.stats.client_errors.on_error,
                # The markers are small and many: librdkafka's default prefetch (100,000
                # messages or 64 MB per partition) alone would take the tracker past 100 MB.
                "queued.min.messages": MARKERS_PREFETCH_MESSAGES,
                "queued.max.messages.kbytes": MARKERS_PREFETCH_KBYTES,
                "fetch.max.bytes": FETCH_MAX_BYTES,
            },
        )
        self._producer = new_producer(settings)
        self._markers = MarkerWriter(settings, queue.markers_topic, producer=self._producer)
        self._reader = RecordReader(settings, f"kmq-tracker-reader.{queue.topic}.{queue.group}")

    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None) -> None:
        """Track until ``stop`` is set (or ``on_tick`` raises); then commit and leave the group.

        Args:
            on_tick: called every loop, at least every :data:`CHECK_INTERVAL_S` seconds, on
                this thread (for a caller's heartbeat or stats line).
        """
        self._consumer.subscribe(
            [self.markers_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        last_check = last_commit = 0.0
        backlog = False
        try:
            while not stop.is_set():
                if on_tick is not None:
                    on_tick()
                # With a backlog of overdue messages, read the markers there are and go on.
                wait_s = 0.0 if backlog else CHECK_INTERVAL_S
                for message in self._consumer.consume(1000, wait_s):
                    self._handle(message)
                now = time.monotonic()
                if backlog or now - last_check >= CHECK_INTERVAL_S:
                    backlog = self.redeliver_overdue() >= REDELIVERY_CHUNK
                    last_check = now
                if now - last_commit >= COMMIT_INTERVAL_S:
                    self._commit(list(self._partitions))
                    self._update_gauges()
                    last_commit = now
        finally:
            self._commit(list(self._partitions))
            self._consumer.close()
            self._reader.close()
            self._producer.flush(DELIVERY_TIMEOUT_S)

    def owned_partitions(self) -> list[int]:
        """Markers partitions this tracker is assigned now."""
        return sorted(self._partitions)

    def caught_up_partitions(self) -> list[int]:
        """Owned markers partitions read to their end since they were assigned: only these
        are redelivered from (step 6)."""
        return sorted(p for p, state in list(self._partitions.items()) if state.caught_up)

    def describe_stats(self) -> str:
        """One line of the tracker's counters, for its log."""
        stats = self.stats
        return (
            f"in flight {self.inflight_count()}, redelivered {stats.redelivered}, "
            f"dead-lettered {stats.dead_lettered}, bad markers {stats.bad_markers}"
        )

    def _update_gauges(self) -> None:
        # Copied here, on the tracker's thread: the in-flight state is not thread-safe, and
        # a metrics scrape reads these from another thread.
        states = list(self._partitions.values())
        self.stats.in_flight = sum(state.inflight.inflight_count() for state in states)
        deadlines = [state.inflight.oldest_open_deadline_ms() for state in states]
        self.stats.oldest_open_deadline_ms = min(
            (deadline for deadline in deadlines if deadline is not None), default=None
        )

    def inflight_count(self) -> int:
        """Unacknowledged messages this tracker knows of."""
        return sum(state.inflight.inflight_count() for state in self._partitions.values())

    # -- 5. and 6.: markers in -------------------------------------------------------------

    def _handle(self, message: Message) -> None:
        partition = message.partition() or 0
        state = self._partitions.get(partition)
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                if state is not None and not state.caught_up:
                    state.caught_up = True
                    log.info("markers partition %d caught up at %s", partition, message.offset())
            else:
                self.stats.client_errors.record(error)
            return
        if state is None:  # a message for a partition revoked meanwhile
            return
        offset = message.offset() or 0
        state.next_offset = offset + 1
        self.stats.markers += 1
        try:
            marker = decode_marker(message.value() or b"")
        except MarkerDecodeError as exc:
            self.stats.bad_markers += 1
            log.warning(
                "skipping marker at %s[%d]@%d: %s", self.markers_topic, partition, offset, exc
            )
            return
        if not self._owns(marker.topic):
            # A forged or misrouted marker must not make the tracker copy another topic's data.
            self.stats.bad_markers += 1
            log.warning("skipping marker for foreign topic %r at offset %d", marker.topic, offset)
            return
        if isinstance(marker, StartMarker):
            state.inflight.record_start(offset, marker)
        else:
            state.inflight.record_end(marker)

    def _owns(self, source_topic: str) -> bool:
        return source_topic == self.topic or source_topic.startswith(f"{self.topic}.{self.group}.")

    # -- 7.: redelivery --------------------------------------------------------------------

    def redeliver_overdue(self) -> int:
        """Redeliver every overdue message of caught-up partitions; returns how many moved."""
        now_ms = self._clock_ms()
        moved = 0
        for markers_partition, state in list(self._partitions.items()):
            if not state.caught_up:
                continue
            overdue = state.inflight.overdue(now_ms, REDELIVERY_CHUNK)
            if overdue:
                moved += self._redeliver(markers_partition, state, overdue)
        return moved

    def _redeliver(
        self, markers_partition: int, state: _PartitionState, refs: list[MessageRef]
    ) -> int:
        by_source: dict[tuple[str, int], list[int]] = defaultdict(list)
        for ref in refs:
            by_source[(ref.topic, ref.partition)].append(ref.offset)
        done: dict[tuple[str, int], list[int]] = defaultdict(list)
        copies = DeliveryTally(self._producer)
        for (topic, partition), offsets in by_source.items():
            read = self._reader.read(topic, partition, offsets)
            ended = done[(topic, partition)]
            for offset, record in sorted(read.found.items()):
                self._produce_copy(record, copies)
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
        if not copies.all_delivered(COPY_ANSWER_TIMEOUT_S):
            # Nothing is ended: every message stays in flight and is tried again next check.
            self.stats.produce_failures += 1
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

    def _produce_copy(self, record: Message, copies: DeliveryTally) -> None:
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
                reason = (
                    f"not acknowledged within its visibility timeout after "
                    f"{self.max_redeliveries} redeliveries"
                )
                tail.append((DLQ_REASON, reason.encode()))
        copies.produce(
            target,
            key=record.key(),
            value=record.value(),
            headers=self._copy_headers(record, headers, tail),
            partition=record.partition() or 0,
        )
        if target == self.dlq_topic:
            self.stats.dead_lettered += 1
        else:
            self.stats.redelivered += 1

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

    def _record_gone(self, ref: MessageRef) -> None:
        self.stats.records_gone += 1
        log.warning("cannot redeliver %s: the record is not in the log; ending it", ref)

    # -- 8.: commits and rebalances --------------------------------------------------------

    def _commit(self, partitions: list[int]) -> None:
        offsets = []
        for partition in partitions:
            state = self._partitions.get(partition)
            if state is None or state.next_offset is None:
                continue
            smallest_open = state.inflight.smallest_open_marker_offset()
            position = state.next_offset if smallest_open is None else smallest_open
            offsets.append(TopicPartition(self.markers_topic, partition, position))
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # a lost commit only means a longer re-read on restart
            log.warning("markers commit failed: %s", exc)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._partitions[tp.partition] = _PartitionState()
        log.info("tracking markers partitions %s", sorted(tp.partition for tp in partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [tp.partition for tp in partitions]
        self._commit(revoked)
        for partition in revoked:
            self._partitions.pop(partition, None)
