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
Step 7 is ``kafka.redelivery`` (``Redeliverer``); the counters and the state per markers
partition are ``kafka.tracker_state`` (``TrackerStats`` is importable from here too). Which
markers partitions a tracker owns, and how it commits them, is ``kafka.tracker_lease``: the
tracker reads on a consumer it assigns by hand, and a tracker that finds its group empty
starts on every partition before the group has formed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, TopicPartition

from kmq_dagster.core.markers import StartMarker, decode_marker
from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import MarkerDecodeError
from kmq_dagster.kafka.clients import admin_client, new_consumer, wall_clock_ms
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.record_reader import FETCH_MAX_BYTES
from kmq_dagster.kafka.redelivery import Redeliverer
from kmq_dagster.kafka.topic_watch import TopicWatch, means_topic_gone, watched_topics
from kmq_dagster.kafka.tracker_lease import TrackerLease
from kmq_dagster.kafka.tracker_state import MarkersPartitionState, TrackerStats

log = logging.getLogger(__name__)

#: How often overdue messages are looked for.
CHECK_INTERVAL_S = 0.1
#: How often the smallest open marker offset is committed.
COMMIT_INTERVAL_S = 1.0
#: Most messages of one markers partition redelivered in one step: a backlog of a million
#: overdue messages moves in bounded chunks, so the tracker's memory stays bounded too.
REDELIVERY_CHUNK = 5_000
#: Prefetch bounds of the markers consumer (see __init__).
MARKERS_PREFETCH_MESSAGES = 20_000
MARKERS_PREFETCH_KBYTES = 8_192

__all__ = ["RedeliveryTracker", "TrackerStats", "tracker_group"]


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
        self.stats = TrackerStats()
        #: Seconds the last stop took (commit, leave the group, flush), once :meth:`run` ended.
        self.stopped_in_s: float | None = None
        self._clock_ms = clock_ms
        self._partitions: dict[int, MarkersPartitionState] = {}
        # The reader: assigned the owned partitions by hand, never a member of the group.
        self._consumer = new_consumer(
            settings,
            tracker_group(queue),
            **{
                "enable.partition.eof": True,
                "error_cb": self.stats.client_errors.on_error,
                # The markers are small and many: librdkafka's default prefetch (100,000
                # messages or 64 MB per partition) alone would take the tracker past 100 MB.
                # Each bound is the user's where -X / KMQ_KAFKA_* sets it.
                **settings.fetch_limits(
                    queued_min_messages=MARKERS_PREFETCH_MESSAGES,
                    queued_max_messages_kbytes=MARKERS_PREFETCH_KBYTES,
                    fetch_max_bytes=FETCH_MAX_BYTES,
                ),
            },
        )
        self._lease = TrackerLease(
            settings,
            tracker_group(queue),
            self.markers_topic,
            on_gain=self._gain,
            on_lose=self._lose,
            on_release=self._commit,
            on_regain=self._catch_up_again,
            error_cb=self.stats.client_errors.on_error,
        )
        self._redeliverer = Redeliverer(settings, queue, self.stats)
        self._admin = admin_client(settings)
        self._topic_watch = TopicWatch(
            self._admin,
            watched_topics(queue),
            fix=f"kmq provision --topic {queue.topic} --group {queue.group}",
        )

    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None) -> None:
        """Track until ``stop`` is set (or ``on_tick`` raises); then commit and leave the group.

        Raises:
            TopicDeletedError: the markers topic was deleted while tracking.

        Args:
            on_tick: called every loop, at least every :data:`CHECK_INTERVAL_S` seconds, on
                this thread (for a caller's heartbeat or stats line).
        """
        self._lease.start(self._admin)
        last_check = last_commit = 0.0
        backlog = False
        try:
            while not stop.is_set():
                if on_tick is not None:
                    on_tick()
                self._topic_watch.check_due()
                self._lease.poll()
                # With a backlog of overdue messages, read the markers there are and go on.
                wait_s = 0.0 if backlog else CHECK_INTERVAL_S
                for message in self._consumer.consume(1000, wait_s):
                    self._handle(message)
                now = time.monotonic()
                if backlog or now - last_check >= CHECK_INTERVAL_S:
                    backlog = self.redeliver_overdue() >= REDELIVERY_CHUNK
                    last_check = now
                if now - last_commit >= COMMIT_INTERVAL_S:
                    self._commit(self.owned_partitions())
                    self._update_gauges()
                    last_commit = now
        finally:
            stopping = time.monotonic()
            self._lease.settle()
            self._lease.close(self._positions(self.owned_partitions()))
            self._consumer.close()
            self._redeliverer.close()
            # How long a stop takes is what an operator waiting on CANCELING wants to know.
            self.stopped_in_s = time.monotonic() - stopping
            log.info("tracker of %s: %s", self.markers_topic, self.describe_stop())

    def owned_partitions(self) -> list[int]:
        """Markers partitions this tracker may redeliver from now (its share of the group's,
        or every one while it starts early)."""
        owns = self._lease.owns
        return sorted(p for p in list(self._partitions) if owns(p))

    def caught_up_partitions(self) -> list[int]:
        """Owned markers partitions read to their end since they were assigned: only these
        are redelivered from (step 6)."""
        owns = self._lease.owns
        return sorted(
            p for p, state in list(self._partitions.items()) if state.caught_up and owns(p)
        )

    @property
    def started_early(self) -> bool:
        """Whether this tracker found its group empty and started on every markers partition
        before the group had formed (``kafka.tracker_lease``)."""
        return self._lease.started_early

    @property
    def tracking_early(self) -> bool:
        """Whether it still holds partitions the group has not given it yet."""
        return self._lease.early

    def describe_stop(self) -> str:
        """How the last stop went, for its log."""
        return (
            f"stopped in {self.stopped_in_s:.1f} s (positions committed, group left, copies "
            "flushed)"
        )

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
        states = self._owned_states()
        self.stats.in_flight = sum(state.inflight.inflight_count() for state in states)
        deadlines = [state.inflight.oldest_open_deadline_ms() for state in states]
        self.stats.oldest_open_deadline_ms = min(
            (deadline for deadline in deadlines if deadline is not None), default=None
        )

    def inflight_count(self) -> int:
        """Unacknowledged messages of the partitions this tracker owns."""
        return sum(state.inflight.inflight_count() for state in self._owned_states())

    def _owned_states(self) -> list[MarkersPartitionState]:
        owns = self._lease.owns
        return [state for p, state in list(self._partitions.items()) if owns(p)]

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
                if means_topic_gone(error):
                    self._topic_watch.check_now()
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
        owns = self._lease.owns
        for markers_partition, state in list(self._partitions.items()):
            if not state.caught_up or not owns(markers_partition):
                continue
            overdue = state.inflight.overdue(now_ms, REDELIVERY_CHUNK)
            if overdue:
                moved += self._redeliverer.redeliver(markers_partition, state, overdue)
        return moved

    # -- 8.: commits and rebalances --------------------------------------------------------

    def _positions(self, partitions: list[int]) -> list[TopicPartition]:
        """Where a tracker would resume each of ``partitions`` (read ones only): its smallest
        open marker offset, or the offset after the last marker read."""
        offsets = []
        for partition in partitions:
            state = self._partitions.get(partition)
            if state is None or state.next_offset is None:
                continue
            smallest_open = state.inflight.smallest_open_marker_offset()
            position = state.next_offset if smallest_open is None else smallest_open
            offsets.append(TopicPartition(self.markers_topic, partition, position))
        return offsets

    def _commit(self, partitions: list[int]) -> None:
        try:
            self._lease.commit(self._positions(partitions))
        except Exception as exc:  # a lost commit only means a longer re-read on restart
            log.warning("markers commit failed: %s", exc)

    def _gain(self, partitions: list[int]) -> None:
        if not partitions:
            return
        for partition in partitions:
            self._partitions[partition] = MarkersPartitionState()
        # No offset given: the reader resumes from the group's committed position (step 5).
        self._consumer.incremental_assign(
            [TopicPartition(self.markers_topic, p) for p in partitions]
        )

    def _catch_up_again(self, partitions: list[int]) -> None:
        # Read on from where the tracker got to, and wait for the partition's end again
        # before redelivering (step 6): another tracker may have owned it meanwhile. A new
        # assignment is what makes the client report the end once more.
        topic = self.markers_topic
        self._consumer.incremental_unassign([TopicPartition(topic, p) for p in partitions])
        resumed = []
        for partition in partitions:
            state = self._partitions[partition]
            state.caught_up = False
            if state.next_offset is None:  # nothing read yet: from the committed position
                resumed.append(TopicPartition(topic, partition))
            else:
                resumed.append(TopicPartition(topic, partition, state.next_offset))
        self._consumer.incremental_assign(resumed)

    def _lose(self, partitions: list[int]) -> None:
        if not partitions:
            return
        self._commit([p for p in partitions if self._lease.owns(p)])
        self._consumer.incremental_unassign(
            [TopicPartition(self.markers_topic, p) for p in partitions]
        )
        for partition in partitions:
            self._partitions.pop(partition, None)
