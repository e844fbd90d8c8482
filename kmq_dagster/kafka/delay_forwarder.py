"""The delay forwarder: moves delayed messages down the level ladder and delivers them when due.

Run one or more per queue topic (``kmq delayer --topic T``); they share the level topics'
partitions in the consumer group ``<T>.kmq-delayer``. A forwarder reads the ladder when it
starts, from the level topics provisioning created. A fetched message's offset is committed
only after the broker acknowledged where it went (the next level, the queue topic, or the
delay DLQ), so a forwarder killed at any point loses nothing; it may deliver a message twice.

With tracing on (``kmq_dagster.tracing``), each copy is a span of the message's trace (``delay
<level topic>`` for a hop, ``deliver <topic>`` when due, ``dead-letter <delay DLQ>``), a child
of the previous hop's, and carries its context on.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kmq_dagster.core.commits import CommitQueue
from kmq_dagster.core.delay import (
    CORRUPT_DELAY_METADATA,
    HOP_DUE_MS,
    HOP_LEAD_MS,
    Deliver,
    Hold,
    Hop,
    delay_headers,
    found_ladder,
    next_step,
    read_delay_times,
)
from kmq_dagster.core.headers import DLQ_REASON, normalize_headers, replace_headers
from kmq_dagster.core.naming import delay_dlq_topic, delay_topic, delay_topics
from kmq_dagster.kafka.clients import ClientErrors, new_consumer, new_producer, wall_clock_ms
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S, produce
from kmq_dagster.kafka.due_gate import DueGate, group_by_source
from kmq_dagster.kafka.group_exit import LEAVE_WAIT_S, leave_group
from kmq_dagster.kafka.group_offsets import apply_ready_offsets
from kmq_dagster.kafka.message import record_offset, record_source
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import copied_headers, tracing_active

log = logging.getLogger(__name__)

#: Longest a poll waits, so held messages and paused partitions are served on time.
MAX_POLL_WAIT_S = 0.1


def delayer_group(topic: str) -> str:
    """The consumer group of ``topic``'s delay forwarders."""
    return f"{topic}.kmq-delayer"


@dataclass
class DelayerStats:
    """Counters an operator or a test reads; never reset."""

    fetched: int = 0
    hopped: int = 0
    delivered: int = 0
    corrupt: int = 0
    write_failures: int = 0
    client_errors: ClientErrors = field(default_factory=ClientErrors)


@dataclass(order=True)
class _Held:
    """A message due within the smallest level, waiting in memory."""

    due_ms: int
    sequence: int
    record: Message = field(compare=False)
    batch_id: int = field(compare=False)


class DelayForwarder:
    """Forward ``topic``'s delayed messages until they are due, then deliver them to ``topic``."""

    def __init__(
        self,
        settings: KmqSettings,
        topic: str,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        batch_size: int | None = None,
    ) -> None:
        self.topic = topic
        self.stats = DelayerStats()
        self.dlq_topic = delay_dlq_topic(topic)
        #: The ladder, read once from the level topics provisioning created.
        self.levels_ms = found_ladder(topic, partition_counts(settings))
        self._levels = {delay_topic(topic, level_ms) for level_ms in self.levels_ms}
        self._batch_size = batch_size or settings.batch_size
        self._clock_ms = clock_ms
        require_topics(
            settings,
            topic,
            delay_topics(topic, self.levels_ms),
            fix=f"kmq provision --topic {topic} --delays",
        )
        self._producer = new_producer(settings, **{"linger.ms": 5})
        self._consumer = new_consumer(
            settings,
            delayer_group(topic),
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "error_cb": self.stats.client_errors.on_error,
            },
        )
        #: Partitions the group gave this forwarder; kept here because other threads may ask
        #: (``Consumer.assignment()`` can block for a long time while another thread consumes).
        self._assigned: set[tuple[str, int]] = set()
        self._consumer.subscribe(
            sorted(self._levels),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._gate = DueGate(self._consumer)
        self._commits = CommitQueue()
        self._held: list[_Held] = []
        self._sequence = itertools.count()

    def run(self, stop: threading.Event) -> None:
        """Forward until ``stop`` is set; then write what is pending and leave the group."""
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.close()

    def step(self) -> None:
        """One round: deliver what is due, fetch, forward, commit what is durable."""
        now_ms = self._clock_ms()
        self._gate.resume_due(now_ms)
        self._deliver_held(now_ms)
        self._settle()
        records = self._consumer.consume(self._batch_size, self._poll_wait_s(now_ms))
        valid = [record for record in records if not self._is_error(record)]
        if not valid:
            return
        now_ms = self._clock_ms()
        batches = group_by_source(valid, record_source)
        ready = self._gate.hold_back(batches, now_ms, self._leave_at_ms, record_offset)
        if not ready:
            return
        self.stats.fetched += len(ready)
        positions: dict[tuple[str, int], tuple[int, int]] = {}
        for record in ready:
            source, offset = record_source(record), record_offset(record)
            first, _ = positions.get(source, (offset, offset))
            positions[source] = (first, offset + 1)
        batch_id = self._commits.add(positions, markers=len(ready))
        for record in ready:
            self._forward(record, now_ms, batch_id)
        self._producer.poll(0)

    def describe_stats(self) -> str:
        """One line of the forwarder's counters, for its log."""
        stats = self.stats
        return (
            f"delivered {stats.delivered}, moved between levels {stats.hopped}, "
            f"corrupt {stats.corrupt}"
        )

    def assignment_ready(self) -> bool:
        """True once the group has assigned this forwarder at least one partition; any thread."""
        return bool(self._assigned)

    def close(self) -> None:
        """Deliver nothing more; write what was produced, commit it, leave the group.

        Messages held in memory are not committed: the next owner of their partition reads
        them again from the level topic.
        """
        self._producer.flush(DELIVERY_TIMEOUT_S)
        self._settle(asynchronous=False)
        # The revoke is served here, not inside the client's close (kafka/group_exit.py).
        leave_group(self._consumer, LEAVE_WAIT_S)
        self._consumer.close()

    # -- internals --------------------------------------------------------------------------

    def _leave_at_ms(self, record: Message) -> int | None:
        try:
            times = read_delay_times(normalize_headers(record.headers()), self._clock_ms())
        except ValueError:
            return None  # take it now: _forward dead-letters it
        return times.hop_due_ms - HOP_LEAD_MS

    def _forward(self, record: Message, now_ms: int, batch_id: int) -> None:
        headers = normalize_headers(record.headers())
        try:
            times = read_delay_times(headers, now_ms)
        except ValueError as exc:
            self.stats.corrupt += 1
            log.warning("delayed message %s is corrupt: %s", _describe(record), exc)
            reason = f"{CORRUPT_DELAY_METADATA}: {exc}"
            self._produce(
                self.dlq_topic, record, {DLQ_REASON: reason}, batch_id, operation="dead-letter"
            )
            return
        step = next_step(times.due_ms, now_ms, self.levels_ms)
        if isinstance(step, Hold):
            heapq.heappush(self._held, _Held(step.until_ms, next(self._sequence), record, batch_id))
        elif isinstance(step, Hop):
            self.stats.hopped += 1
            target = delay_topic(self.topic, step.level_ms)
            updates = delay_headers(step, times.due_ms)
            self._produce(target, record, updates, batch_id, operation="delay")
        else:
            assert isinstance(step, Deliver)
            self._deliver(record, batch_id)

    def _deliver(self, record: Message, batch_id: int) -> None:
        self.stats.delivered += 1
        self._produce(self.topic, record, {}, batch_id, operation="deliver", drop=(HOP_DUE_MS,))

    def _deliver_held(self, now_ms: int) -> None:
        while self._held and self._held[0].due_ms <= now_ms:
            held = heapq.heappop(self._held)
            self._deliver(held.record, held.batch_id)

    def _produce(
        self,
        target: str,
        record: Message,
        updates: Mapping[str, str],
        batch_id: int,
        *,
        operation: str,
        drop: tuple[str, ...] = (),
    ) -> None:
        """Copy ``record`` to ``target`` with ``updates``; ``operation`` names its span."""
        original = normalize_headers(record.headers())
        headers = [
            (key, value) for key, value in replace_headers(original, updates) if key not in drop
        ]
        if tracing_active():
            source = (record.topic() or "", record.partition() or 0, record.offset() or 0)
            headers = copied_headers(
                operation, target, headers, source=source, source_headers=original
            )

        def on_delivery(error: KafkaError | None, _written: Message) -> None:
            if error is not None:
                self.stats.write_failures += 1
                log.warning("delayed message not forwarded (%s); it is read again", error)
            self._commits.marker_delivered(batch_id, ok=error is None)

        produce(
            self._producer,
            target,
            key=record.key(),
            value=record.value(),
            headers=[*headers],
            on_delivery=on_delivery,
        )

    def _settle(self, asynchronous: bool = True) -> None:
        """Commit fetched offsets whose messages are durably forwarded; re-read failed ones."""
        self._producer.poll(0)
        ready = self._commits.take_ready()
        if ready.rewind:
            self._drop_held(set(ready.rewind))
        failure = apply_ready_offsets(self._consumer, ready, asynchronous=asynchronous)
        if failure is not None:
            log.warning("offset commit failed, messages may be forwarded twice: %s", failure)

    def _poll_wait_s(self, now_ms: int) -> float:
        wakes = [self._held[0].due_ms] if self._held else []
        resume_ms = self._gate.next_resume_ms()
        if resume_ms is not None:
            wakes.append(resume_ms)
        if not wakes:
            return MAX_POLL_WAIT_S
        return max(0.0, min(MAX_POLL_WAIT_S, (min(wakes) - now_ms) / 1000))

    def _drop_held(self, sources: set[tuple[str, int]]) -> None:
        kept = [held for held in self._held if record_source(held.record) not in sources]
        if len(kept) != len(self._held):
            self._held = kept
            heapq.heapify(self._held)

    def _is_error(self, record: Message) -> bool:
        error = record.error()
        if error is None:
            return False
        if error.code() != KafkaError._PARTITION_EOF:
            self.stats.client_errors.record(error)
            if error.fatal():
                raise KafkaException(error)
        return True

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned |= {(p.topic, p.partition) for p in partitions}

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        sources = {(p.topic, p.partition) for p in partitions}
        self._assigned -= sources
        log.info("delay partitions revoked: %s", sorted(sources))
        self._producer.flush(DELIVERY_TIMEOUT_S)
        self._settle(asynchronous=False)
        self._commits.forget(sources)
        self._gate.forget(sources)
        self._drop_held(sources)


def _describe(record: Message) -> str:
    return f"{record.topic()}[{record.partition()}]@{record.offset()}"
