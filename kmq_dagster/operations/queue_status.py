"""Measuring a queue: lag, in flight, oldest unacknowledged age, retry depths, DLQ, breaker.

One measurement, without joining any consumer group (invariant 6: no ListOffsets answers):
  1. the committed offsets of the group (queue, redelivery and retry topics), of its trackers
     (markers topic) and of its DLQ ingesters (DLQ topic), from the group coordinator;
  2. one reader assigned to every one of those partitions at its committed offset: the first
     fetch of a partition (a record or its end) carries its high watermark, after which the
     partition is paused; a retry partition's first record tells when it is due;
  3. the markers partitions are read from the trackers' committed position (everything before
     it is settled) to their end and folded into in-flight state, as the tracker does;
  4. the breaker state comes from the audit store, when one is given.
Work per call is one fetch per queue partition plus the markers since the trackers' last
commit, so it suits a sensor tick (measured in ``kmq bench dagster``).

Examples:
    >>> status = measure_queue(open_queue(settings, "orders", "billing"))
    ...                                                               # doctest: +SKIP
    >>> status.lag, status.inflight, status.retry_depths              # doctest: +SKIP
    (1200, 35, {'orders.billing.retry.10s': 4})
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.inflight import PartitionInflight
from kmq_dagster.core.markers import StartMarker, decode_marker
from kmq_dagster.core.retry_headers import read_due_ms
from kmq_dagster.core.status import PartitionLag, QueueStatus, RetryHead
from kmq_dagster.errors import KafkaUnavailableError, KmqTimeoutError, MarkerDecodeError
from kmq_dagster.kafka.clients import ClientErrors, admin_client, new_consumer, wall_clock_ms
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import tracker_group
from kmq_dagster.operations.dlq_ingester import ingester_group
from kmq_dagster.settings import KmqSettings

__all__ = ["QueueStatus", "measure_queue"]

#: Bytes fetched per partition and request: enough for thousands of markers, little of a
#: backlog (only its first record is needed).
FETCH_BYTES_PER_PARTITION = 64 * 1024

Source = tuple[str, int]


def measure_queue(
    opened: OpenedQueue,
    *,
    store: AuditStore | None = None,
    timeout_s: float = 10.0,
    clock_ms: Callable[[], int] = wall_clock_ms,
    in_flight: bool = True,
) -> QueueStatus:
    """What ``queue`` is doing now.

    Args:
        store: the audit store holding the group's shared breaker; without it the breaker
            state is ``"unknown"``.
        timeout_s: how long the reads may take; markers not read by then make the in-flight
            figures a lower bound (``markers_complete`` is false).
        in_flight: also fold the markers into in-flight figures (reading the markers written
            since the trackers' committed position); without, they are zero and only offsets
            are measured.

    Raises:
        KmqTimeoutError: a queue or DLQ partition gave no fetch answer within ``timeout_s``.
        KafkaUnavailableError: the group coordinator did not answer.
    """
    settings, queue = opened.settings, opened.queue
    partitions = range(opened.partitions)
    aux = range(opened.dlq_partitions)  # redelivery, retry and dead-letter topics
    consumed = [
        (topic, p)
        for topic in queue.consumed_topics
        for p in range(queue.partitions_of(topic) or 1)
    ]
    markers = [(queue.markers_topic, p) for p in partitions] if in_flight else []
    dlq = [(queue.dlq_topic, p) for p in aux]
    admin = admin_client(settings)
    starts = {
        **_committed(admin, queue.group, consumed, settings),
        **(_committed(admin, tracker_group(queue), markers, settings) if markers else {}),
        **_committed(admin, ingester_group(queue), dlq, settings),
    }
    reading = _Reading(settings, starts, set(queue.retry_topics.values()), queue.markers_topic)
    try:
        reading.run(time.monotonic() + timeout_s)
    finally:
        reading.close()
    now_ms = clock_ms()
    lags = {
        source: PartitionLag(source[0], source[1], reading.ends[source], starts[source])
        for source in (*consumed, *dlq)
    }
    folded = reading.markers.summary(now_ms)
    breaker = store.breaker_state(queue.topic, queue.group) if store is not None else None
    is_open = breaker is not None and breaker.state != "closed"
    return QueueStatus(
        topic=queue.topic,
        group=queue.group,
        measured_at_ms=now_ms,
        lags=tuple(lags[(queue.topic, p)] for p in partitions),
        redelivery=tuple(lags[(queue.redelivery_topic, p)] for p in aux),
        retries=tuple(lags[(t, p)] for t in queue.retry_topics.values() for p in aux),
        retry_heads=tuple(
            RetryHead(t, p, due_ms)
            for (t, p), due_ms in sorted(reading.heads.items())
            if lags[(t, p)].pending
        ),
        inflight=folded.inflight,
        oldest_unacked_started_ms=folded.oldest_started_ms,
        overdue=folded.overdue,
        markers_complete=not reading.markers_open,
        dlq_depth=sum(lags[source].end_offset for source in dlq),
        dlq_uningested=sum(lags[source].pending for source in dlq),
        breaker_state="unknown" if store is None else (breaker.state if breaker else "closed"),
        breaker_opened_at_ms=breaker.opened_at_ms if breaker is not None and is_open else None,
        breaker_cooldown_ms=breaker.cooldown_ms if breaker is not None and is_open else None,
    )


def _committed(
    admin: AdminClient, group: str, sources: Iterable[Source], settings: KmqSettings
) -> dict[Source, int]:
    """The group's committed offset per partition (0 where it never committed)."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in sources])
    timeout_s = settings.request_timeout_ms / 1000
    try:
        future = admin.list_consumer_group_offsets([request], request_timeout=timeout_s)[group]
        answer = future.result(timeout=timeout_s + 5)
    except (KafkaException, TimeoutError) as exc:
        raise KafkaUnavailableError(
            f"cannot read the committed offsets of group {group} at "
            f"{settings.bootstrap_servers}: {exc}"
        ) from None
    return {(tp.topic, tp.partition): max(tp.offset, 0) for tp in answer.topic_partitions}


@dataclass
class _Markers:
    """In-flight state folded from markers partitions, as the tracker builds it."""

    partitions: dict[int, PartitionInflight] = field(default_factory=dict)
    #: Record timestamp of each start marker read, by (markers partition, offset).
    started_ms: dict[tuple[int, int], int] = field(default_factory=dict)
    bad: int = 0

    def add(self, record: Message) -> None:
        partition, offset = record.partition() or 0, record.offset() or 0
        state = self.partitions.setdefault(partition, PartitionInflight())
        try:
            marker = decode_marker(record.value() or b"")
        except MarkerDecodeError:
            self.bad += 1
            return
        if isinstance(marker, StartMarker):
            state.record_start(offset, marker)
            self.started_ms[(partition, offset)] = record.timestamp()[1]
        else:
            state.record_end(marker)

    def summary(self, now_ms: int) -> _MarkerSummary:
        oldest: int | None = None
        for partition, state in self.partitions.items():
            smallest = state.smallest_open_marker_offset()
            if smallest is not None:
                started = self.started_ms.get((partition, smallest), now_ms)
                oldest = started if oldest is None else min(oldest, started)
        return _MarkerSummary(
            inflight=sum(s.inflight_count() for s in self.partitions.values()),
            oldest_started_ms=oldest,
            overdue=sum(len(s.overdue(now_ms)) for s in self.partitions.values()),
        )


@dataclass(frozen=True)
class _MarkerSummary:
    inflight: int
    oldest_started_ms: int | None
    overdue: int


class _Reading:
    """One reader over every partition of a measurement (step 2 and 3 of the module doc)."""

    def __init__(
        self,
        settings: KmqSettings,
        starts: dict[Source, int],
        retry_topics: set[str],
        markers_topic: str,
    ) -> None:
        self.errors = ClientErrors()
        self.retry_topics = retry_topics
        self.markers_topic = markers_topic
        self.ends: dict[Source, int] = {}
        self.heads: dict[Source, int | None] = {}
        self.markers = _Markers()
        self.waiting = {s for s in starts if s[0] != markers_topic}
        self.markers_open = {p for t, p in starts if t == markers_topic}
        self.consumer: Consumer = new_consumer(
            settings,
            f"kmq-status-{uuid.uuid4().hex}",
            **{
                "enable.partition.eof": True,
                **settings.fetch_limits(max_partition_fetch_bytes=FETCH_BYTES_PER_PARTITION),
                "error_cb": self.errors.on_error,
            },
        )
        self.consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])

    def run(self, deadline: float) -> None:
        while self.waiting or self.markers_open:
            if time.monotonic() > deadline:
                if self.waiting:
                    shown = ", ".join(f"{t}[{p}]" for t, p in sorted(self.waiting)[:3])
                    raise KmqTimeoutError(
                        f"no fetch answer within the time allowed from {len(self.waiting)} "
                        f"partitions ({shown}...)"
                    )
                return  # markers not read to the end: the figures are a lower bound
            for record in self.consumer.consume(1_000, 0.2):
                self._take(record)

    def _take(self, record: Message) -> None:
        source = (record.topic() or "", record.partition() or 0)
        error = record.error()
        at_end = error is not None and error.code() == KafkaError._PARTITION_EOF
        if error is not None and not at_end:
            self.errors.record(error)
            if error.fatal():
                raise KafkaException(error)
            return
        if source[0] == self.markers_topic:
            if at_end:
                self.markers_open.discard(source[1])
            else:
                self.markers.add(record)
            return
        if source not in self.waiting:
            return
        _low, high = self.consumer.get_watermark_offsets(TopicPartition(*source), cached=True)
        if high < 0:
            if not at_end:
                return  # no watermark yet: take the next answer
            high = record.offset() or 0  # an end event carries the end offset
        if source[0] in self.retry_topics and not at_end:
            self.heads[source] = _due_or_none(record)
        self.ends[source] = high
        self.waiting.discard(source)
        self.consumer.pause([TopicPartition(*source)])

    def close(self) -> None:
        self.consumer.close()


def _due_or_none(record: Message) -> int | None:
    """When a retry record is due; ``None`` (due now) when its header is missing or unreadable:
    the consumer sends such a record to the DLQ at once, which is work too."""
    try:
        return read_due_ms(normalize_headers(record.headers()))
    except ValueError:
        return None
