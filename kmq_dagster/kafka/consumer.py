"""A consumer whose messages are acknowledged one by one (the kmq protocol, consumer side).

Protocol, per fetched batch:
  1. fetch a batch from the queue topic and the group's redelivery topic;
  2. write one start marker per contiguous run of offsets (deadline = now + visibility timeout)
     and wait until the broker has acknowledged every one of them;
  3. only then commit the batch's offsets (invariant 2: start before commit);
  4. hand the messages out; ``ack`` writes end markers, coalesced into runs, from any thread.
A message that is never acknowledged is redelivered by the tracker once its deadline passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kmq_dagster.core.headers import REDELIVERY_COUNT, Headers, int_header, normalize_headers
from kmq_dagster.core.markers import EndMarker, StartMarker, encode_marker
from kmq_dagster.core.naming import markers_topic, redelivery_topic
from kmq_dagster.core.ranges import offset_runs
from kmq_dagster.errors import KmqError
from kmq_dagster.kafka.clients import CLIENT_LOGGER, admin_client, cluster_metadata
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: How often acknowledgements are turned into end markers when nobody polls.
ACK_FLUSH_INTERVAL_S = 0.02
#: How long to wait for the broker to acknowledge a batch's start markers.
MARKER_WRITE_TIMEOUT_S = 30.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class KmqMessage:
    """One message handed out by :class:`KmqConsumer`; acknowledge it with ``consumer.ack``."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    #: How often the tracker has redelivered this message (0 on first delivery).
    redelivery_count: int


@dataclass
class ConsumerStats:
    """Counters an operator or a test reads; never reset."""

    fetched: int = 0
    acked: int = 0
    nacked: int = 0
    start_markers: int = 0
    end_markers: int = 0
    marker_write_failures: int = 0
    commit_failures: int = 0
    client_errors: int = 0
    bad_headers: int = 0
    by_error: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class KmqConsumer:
    """Consume ``topic`` in ``group`` with per-message acknowledgement.

    Examples:
        >>> consumer = KmqConsumer(settings, "orders", "billing")  # doctest: +SKIP
        >>> for message in consumer.poll():                         # doctest: +SKIP
        ...     handle(message)
        ...     consumer.ack(message)
    """

    def __init__(
        self,
        settings: KmqSettings,
        topic: str,
        group: str,
        *,
        visibility_timeout_ms: int | None = None,
        batch_size: int | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.topic = topic
        self.group = group
        self.markers_topic = markers_topic(topic, group)
        self.redelivery_topic = redelivery_topic(topic, group)
        self.visibility_timeout_ms = visibility_timeout_ms or settings.visibility_timeout_ms
        self.batch_size = batch_size or settings.batch_size
        self.stats = ConsumerStats()
        self._clock_ms = clock_ms
        self._check_topics(settings)
        self._producer = Producer(
            settings.producer_config(**{"linger.ms": 2, "logger": CLIENT_LOGGER})
        )
        self._consumer = Consumer(
            settings.consumer_config(
                group,
                **{
                    "partition.assignment.strategy": "cooperative-sticky",
                    "logger": CLIENT_LOGGER,
                    "error_cb": self._on_client_error,
                },
            )
        )
        self._consumer.subscribe(
            [topic, self.redelivery_topic], on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._ack_lock = threading.Lock()
        self._pending_acks: list[tuple[str, int, int]] = []
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_acks_periodically, name=f"kmq-acks-{topic}", daemon=True
        )
        self._flusher.start()

    # -- the protocol ---------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[KmqMessage]:
        """Fetch up to ``batch_size`` messages, mark them in flight, commit, hand them out.

        Raises:
            KmqError: the markers could not be written; the batch is rewound and fetched again.
        """
        fetched = [m for m in self._consumer.consume(self.batch_size, timeout_s) if self._ok(m)]
        if not fetched:
            return []
        self.stats.fetched += len(fetched)
        deadline_ms = self._clock_ms() + self.visibility_timeout_ms
        by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
        for message in fetched:
            by_partition[(message.topic() or "", message.partition() or 0)].append(
                message.offset() or 0
            )
        # 2. start markers, broker-acknowledged, before 3. the commit.
        starts = [
            StartMarker(topic, partition, first, count, deadline_ms)
            for (topic, partition), offsets in by_partition.items()
            for first, count in offset_runs(offsets)
        ]
        try:
            self._write_markers_durably(starts)
        except KmqError:
            self._rewind(by_partition)
            raise
        self.stats.start_markers += len(starts)
        self._commit(
            [
                TopicPartition(topic, partition, max(offsets) + 1)
                for (topic, partition), offsets in by_partition.items()
            ]
        )
        return [self._to_kmq_message(m) for m in fetched]

    def ack(self, message: KmqMessage) -> None:
        """Acknowledge ``message``: it will not be redelivered. Any thread, any order."""
        with self._ack_lock:
            self._pending_acks.append((message.topic, message.partition, message.offset))
        self.stats.acked += 1

    def nack(self, message: KmqMessage) -> None:
        """Ask for ``message`` to be redelivered now (counts as one redelivery)."""
        self._produce_marker(
            StartMarker(message.topic, message.partition, message.offset, 1, self._clock_ms())
        )
        self.stats.nacked += 1

    def extend(self, message: KmqMessage, seconds: float) -> None:
        """Keep ``message`` in flight for ``seconds`` more from now (a long-running handler)."""
        deadline_ms = self._clock_ms() + round(seconds * 1000)
        self._produce_marker(
            StartMarker(message.topic, message.partition, message.offset, 1, deadline_ms)
        )

    def assignment_ready(self) -> bool:
        """True once the group has assigned this consumer at least one partition."""
        return bool(self._consumer.assignment())

    def flush(self, timeout_s: float = 30.0) -> None:
        """Write every pending acknowledgement and wait for the broker to take it."""
        self._flush_acks()
        self._producer.flush(timeout_s)

    def close(self) -> None:
        """Flush acknowledgements and leave the group."""
        self._stop.set()
        self._flusher.join(timeout=5)
        self.flush()
        self._consumer.close()

    # -- internals --------------------------------------------------------------------------

    def _check_topics(self, settings: KmqSettings) -> None:
        topics = cluster_metadata(admin_client(settings), settings).topics
        needed = [self.topic, self.markers_topic, self.redelivery_topic]
        missing = [name for name in needed if name not in topics]
        if missing:
            raise KmqError(
                f"topics missing: {', '.join(missing)}; run "
                f"`kmq provision --topic {self.topic} --group {self.group}` first"
            )
        counts = {name: len(topics[name].partitions) for name in needed}
        if len(set(counts.values())) != 1:
            raise KmqError(f"partition counts differ: {counts}; every queue topic needs the same")

    def _ok(self, message: Message) -> bool:
        error = message.error()
        if error is None:
            return True
        if error.code() != KafkaError._PARTITION_EOF:
            self._count_error(error)
            if error.fatal():
                raise KafkaException(error)
        return False

    def _to_kmq_message(self, message: Message) -> KmqMessage:
        headers = normalize_headers(message.headers())
        try:
            redelivery_count = int_header(headers, REDELIVERY_COUNT) or 0
        except ValueError:
            # Still delivered: the handler decides; the tracker treats it as corrupt metadata.
            self.stats.bad_headers += 1
            redelivery_count = 0
        return KmqMessage(
            topic=message.topic() or "",
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            key=message.key(),
            value=message.value(),
            headers=headers,
            timestamp_ms=message.timestamp()[1],
            redelivery_count=redelivery_count,
        )

    def _write_markers_durably(self, markers: list[StartMarker]) -> None:
        failures: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failures.append(error)

        for marker in markers:
            self._producer.produce(
                self.markers_topic,
                value=encode_marker(marker),
                partition=marker.partition,
                on_delivery=on_delivery,
            )
        remaining = self._producer.flush(MARKER_WRITE_TIMEOUT_S)
        if failures or remaining:
            self.stats.marker_write_failures += 1
            reason = failures[0].str() if failures else f"{remaining} still queued"
            raise KmqError(f"start markers not written ({reason}); batch will be fetched again")

    def _rewind(self, by_partition: dict[tuple[str, int], list[int]]) -> None:
        for (topic, partition), offsets in by_partition.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, min(offsets)))
            except KafkaException as exc:
                # Not assigned any more: its new owner starts from the committed offset.
                log.warning("could not rewind %s[%d]: %s", topic, partition, exc)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Start markers are written: if the partition moved, its new owner re-reads these
            # messages (duplicates, never losses), and the tracker covers them meanwhile.
            self.stats.commit_failures += 1
            log.warning("offset commit failed, messages may be delivered twice: %s", exc)

    def _produce_marker(self, marker: StartMarker | EndMarker) -> None:
        self._producer.produce(
            self.markers_topic, value=encode_marker(marker), partition=marker.partition
        )
        self._producer.poll(0)

    def _flush_acks(self) -> None:
        with self._ack_lock:
            pending, self._pending_acks = self._pending_acks, []
        if not pending:
            self._producer.poll(0)
            return
        by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
        for topic, partition, offset in pending:
            by_partition[(topic, partition)].append(offset)
        for (topic, partition), offsets in by_partition.items():
            for first, count in offset_runs(offsets):
                self._produce_marker(EndMarker(topic, partition, first, count))
                self.stats.end_markers += 1

    def _flush_acks_periodically(self) -> None:
        while not self._stop.wait(ACK_FLUSH_INTERVAL_S):
            try:
                self._flush_acks()
            except Exception:  # the flusher must survive: a lost end marker only redelivers
                log.exception("writing end markers failed; will retry")

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Acks of revoked partitions stay valid (end markers name the message, not the owner);
        # write them before the new owner's tracker view moves on.
        log.info("partitions revoked: %s", [(p.topic, p.partition) for p in partitions])
        self.flush()

    def _on_client_error(self, error: KafkaError) -> None:
        self._count_error(error)
        log.warning("Kafka client error: %s", error.str())

    def _count_error(self, error: KafkaError) -> None:
        self.stats.client_errors += 1
        self.stats.by_error[error.name()] += 1
