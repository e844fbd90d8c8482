"""A consumer whose messages are acknowledged one by one (the kmq protocol, consumer side).

Steps 1-4 of docs/design.md, "The protocol" (the code repeats the numbers), per batch:
  1. fetch a batch from the queue topic and the group's redelivery and retry topics;
  2. write one start marker per contiguous run of offsets (deadline = now + visibility timeout)
     and hand the messages out at once;
  3. commit the batch's offsets only once the broker has acknowledged every one of its start
     markers (invariant 2: start before commit); if a marker fails, fetch the batch again;
  4. ``ack`` writes end markers, coalesced into runs, from any thread and in any order.
A message that is never acknowledged is redelivered by the tracker (steps 5-8) once its
deadline passes. Steps 2 and 3 overlap with the next fetch, so markers cost no round trip per
batch.

The parts live beside it: ``kafka.batch_commits`` (steps 2 and 3), ``kafka.ack_flusher``
(step 4) and ``kafka.consumer_stats`` (``ConsumerStats``, importable from here too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kmq_dagster.core.handouts import HandoutLedger
from kmq_dagster.core.queue_settings import MAX_VISIBILITY_TIMEOUT_MS, short_visibility_warning
from kmq_dagster.core.ranges import OffsetRun, Source
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.ack_flusher import AckFlusher
from kmq_dagster.kafka.batch_commits import BatchCommits
from kmq_dagster.kafka.clients import admin_client, new_consumer, new_producer, wall_clock_ms
from kmq_dagster.kafka.consumer_stats import ConsumerStats
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S
from kmq_dagster.kafka.due_gate import DueGate, group_by_source
from kmq_dagster.kafka.group_exit import LEAVE_WAIT_S, leave_group
from kmq_dagster.kafka.idle_parking import IdleParking
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.message import (
    KmqMessage,
    ViewPool,
    due_ms_or_now,
    message_class,
    record_of,
    record_offset,
    record_source,
)
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.runs import fetched_runs, record_runs
from kmq_dagster.kafka.topic_watch import TopicWatch, means_topic_gone, watched_topics

log = logging.getLogger(__name__)

#: Longest ``extend()``: as long as the longest visibility timeout.
MAX_EXTEND_S = MAX_VISIBILITY_TIMEOUT_MS / 1000
#: How long markers wait to share a produce request. Nothing waits on them: a batch is handed
#: out before its start markers are acknowledged, and only its commit waits.
MARKER_LINGER_MS = 10
#: A hold of fetching (:meth:`KmqConsumer.hold_fetching`) pauses the partitions only once it
#: lasts this long. A pause throws away what librdkafka prefetched, and after the resume its
#: fetcher starts again only on its next turn (0.4 to 0.9 s measured, pause to first record):
#: a concurrent worker whose buffer fills for milliseconds at a time idled that long each time.
PAUSE_AFTER_HOLD_S = 1.0

__all__ = ["ConsumerStats", "KmqConsumer", "KmqMessage", "wall_clock_ms"]


_error_of = Message.error
_headers_of = Message.headers


def _due_ms_of(record: Message) -> int | None:
    return due_ms_or_now(KmqMessage(record))


def _coordinates(message: KmqMessage | Message) -> tuple[str, int, int]:
    record = record_of(message)
    return (*record_source(record), record_offset(record))


class KmqConsumer:
    """Consume ``queue`` (its topic, redeliveries and retries) with per-message acknowledgement.

    Examples:
        >>> consumer = KmqConsumer(open_queue(settings, "orders", "billing"))
        ...                                                         # doctest: +SKIP
        >>> for message in consumer.poll():                         # doctest: +SKIP
        ...     handle(message)
        ...     consumer.ack(message)

    Args:
        clock_ms: the clock deadlines are set by (ms since the epoch); default the wall clock.
        producer: writes the markers; default a new one (tests pass one that fails on purpose).
    """

    def __init__(
        self,
        opened: OpenedQueue,
        *,
        batch_size: int | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        producer: Producer | None = None,
    ) -> None:
        self.opened = opened
        self.queue = queue = opened.queue
        settings = opened.settings
        self.retry_topics = list(queue.retry_topics.values())
        self.markers_topic = queue.markers_topic
        self.visibility_timeout_ms = queue.visibility_timeout_ms
        if (short := short_visibility_warning(queue.visibility_timeout_ms)) is not None:
            log.warning("queue %s, group %s: %s", queue.topic, queue.group, short)
        self.batch_size = batch_size or settings.batch_size
        self.stats = ConsumerStats()
        self._clock_ms = clock_ms
        self._markers = MarkerWriter(
            settings,
            queue.markers_topic,
            producer=producer or new_producer(settings, **{"linger.ms": MARKER_LINGER_MS}),
        )
        self._consumer = new_consumer(
            settings,
            queue.group,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                # Parks the side topics' partitions that were read to the end (IdleParking).
                "enable.partition.eof": True,
                "error_cb": self.stats.client_errors.on_error,
                "on_commit": self._on_commit,
            },
        )
        self._consumer.subscribe(
            queue.consumed_topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._retry_set = frozenset(self.retry_topics)
        #: Whether the last fetch may carry retry metadata to check (a record with headers,
        #: or one from a retry topic); a fetch of neither has none. True until a fetch says.
        self.fetch_has_metadata = True
        self._fetching_held = False
        self._held_since_s = 0.0
        self._paused = False
        #: Retry-topic partitions paused until their next message is due.
        self._gate = DueGate(self._consumer)
        #: Redelivery and retry partitions paused while they have nothing, peeked now and then.
        self._parking = IdleParking(self._consumer, [queue.redelivery_topic, *self.retry_topics])
        self._handouts: HandoutLedger[KmqMessage | Message] = HandoutLedger()
        self._views = ViewPool(message_class(opened.codecs))
        self._batches = BatchCommits(self._consumer, self._markers, self.stats)
        self._ack_flusher = AckFlusher(
            self._markers, self._handouts, self.stats, thread_name=f"kmq-acks-{queue.topic}"
        )
        # ack() appends here, from any thread (see AckFlusher): one lookup less per message.
        self._acks = self._ack_flusher.acks
        # Without its markers topic no message could be started: stop rather than go on. (A
        # consumed topic deleted shows as fetch errors, checked then.) The watch asks with a
        # client of its own, so the loop never waits behind its own fetch for the answer.
        self._topic_watch = TopicWatch(
            admin_client(settings),
            watched_topics(queue),
            fix=f"kmq provision --topic {queue.topic} --group {queue.group}",
        )

    # -- the protocol ---------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[KmqMessage]:
        """Return up to ``batch_size`` messages, as soon as at least one is there.

        Each returned message is in flight: acknowledge it with :meth:`ack`, or it is
        redelivered after the visibility timeout.
        """
        records, runs = self._fetch(timeout_s)
        messages = self._views.views_of(records)
        self._handouts.record(messages, runs)
        return messages

    def poll_records(self, timeout_s: float = 1.0) -> list[Message]:
        """Like :meth:`poll`, but hand out the confluent-kafka records themselves.

        The fastest way through the queue: no wrapper per message. Read them with the
        confluent-kafka API (``record.value()``, ``record.headers()``, ...) and acknowledge
        them with :meth:`ack` like any message.
        """
        records, runs = self._fetch(timeout_s)
        self._handouts.record(records, runs)
        return records

    def ack(self, message: KmqMessage | Message) -> None:
        """4. Acknowledge ``message``: it will not be redelivered. Any thread, any order.

        Takes a message :meth:`poll` or :meth:`poll_records` handed out. Only queues it: the
        end markers are written in runs by the next poll or by the background flusher.
        """
        self._acks.append(message)

    def acknowledger(self) -> Callable[[KmqMessage | Message], None]:
        """What :meth:`ack` does, without its Python frame: the ack queue's own append, for a
        loop acknowledging every message it runs (about 4% of a no-op worker's time)."""
        return self._acks.append

    def nack(self, message: KmqMessage | Message) -> None:
        """Ask for ``message`` to be redelivered now (counts as one redelivery)."""
        self._restart(message, self._clock_ms())
        self.stats.nacked += 1

    def extend(self, message: KmqMessage | Message, seconds: float) -> None:
        """Keep ``message`` in flight for ``seconds`` more from now (a long-running handler).

        Raises:
            ConfigError: ``seconds`` is not a number of seconds from 1 ms to 7 days.
        """
        if not (isinstance(seconds, int | float) and 0.001 <= seconds <= MAX_EXTEND_S):
            raise ConfigError(f"extend takes 0.001 to {MAX_EXTEND_S:g} seconds, got {seconds!r}")
        self._restart(message, self._clock_ms() + round(seconds * 1000))

    def hold_fetching(self, hold: bool) -> None:
        """Stop fetching new messages (``True``) or fetch again (``False``).

        While held, :meth:`poll` keeps the consumer in its group and writes acknowledgements
        but hands out nothing new (at most what was already fetched). For its first
        ``PAUSE_AFTER_HOLD_S`` it fetches nothing and keeps librdkafka's prefetched messages
        (so a short hold costs no refetch); then it pauses the partitions, which serves the
        group's callbacks however long the hold lasts. Partitions waiting for a retry to become
        due stay paused until it is.
        """
        if hold == self._fetching_held:
            return
        self._fetching_held = hold
        self._held_since_s = time.monotonic()
        if not hold and self._paused:
            self._paused = False
            waiting, parked = self._gate.is_paused, self._parking.is_parked
            self._consumer.resume(
                [
                    p
                    for p in self._consumer.assignment()
                    if not (waiting((p.topic, p.partition)) or parked((p.topic, p.partition)))
                ]
            )

    def assigned_partitions(self) -> list[tuple[str, int]]:
        """(topic, partition) pairs the group assigned this consumer now."""
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def assignment_ready(self) -> bool:
        """True once the group has assigned this consumer at least one partition."""
        return bool(self._consumer.assignment())

    def flush(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Write pending acknowledgements and markers, wait for the broker, commit what may be."""
        self._ack_flusher.flush()
        self._markers.flush(timeout_s)
        self._batches.settle(asynchronous=False)

    def close(self) -> None:
        """Flush acknowledgements and leave the group."""
        self._ack_flusher.stop()
        self.flush()
        # The revoke is served here, not inside the client's close (kafka/group_exit.py).
        leave_group(self._consumer, LEAVE_WAIT_S)
        self._consumer.close()

    # -- internals --------------------------------------------------------------------------

    def _fetch(self, timeout_s: float) -> tuple[list[Message], list[OffsetRun]]:
        """1. Fetch a batch; 2. send its start markers; 4. write the acknowledgements so far.
        Returns the records and their runs.

        The end markers follow the start markers at once: the producer's first record after
        a fetch's worth of idleness took about four times the CPU of the one after it (30
        against 7 us, stop 61). A poll that will wait writes them before it waits."""
        fetched = self._fetch_and_start(timeout_s)
        self._ack_flusher.flush_before_poll(waiting=timeout_s > 0, serve=False)
        return fetched

    def _fetch_and_start(self, timeout_s: float) -> tuple[list[Message], list[OffsetRun]]:
        waiting = timeout_s > 0
        self._topic_watch.check_due()
        self._batches.settle()
        if self._fetching_held and not self._paused:
            held_s = time.monotonic() - self._held_since_s
            if held_s < PAUSE_AFTER_HOLD_S:
                # As a paused poll waits; one that may not wait returns at once (a sleep(0)
                # handed the GIL to another thread on every step of a busy loop).
                if waiting:
                    self._ack_flusher.flush_before_poll(waiting=True)  # before the wait
                    time.sleep(min(timeout_s, PAUSE_AFTER_HOLD_S - held_s))
                return [], []
            self._paused = True
        if self._fetching_held:
            self._consumer.pause(self._consumer.assignment())  # new assignments too
        else:
            if self.retry_topics:
                self._gate.resume_due(self._clock_ms())
            self._parking.peek_if_due(self._not_waiting_for_due)
        records = self._fetch_records(timeout_s)
        if not records:
            return [], []
        deadline_ms = self._clock_ms() + self.visibility_timeout_ms
        runs = fetched_runs(records)
        from_retry_topic = bool(self._retry_set) and any(
            source[0] in self._retry_set for source, _, _ in runs
        )
        if from_retry_topic:
            records = self._hold_back_not_due(records)
            runs = record_runs(records)
        if records:
            self._batches.start(runs, deadline_ms)
        # (a retry-topic record held back leaves the flag set: checking more is always safe)
        self.fetch_has_metadata = from_retry_topic or any(map(_headers_of, records))
        return records, runs

    def _fetch_records(self, timeout_s: float) -> list[Message]:
        """The records fetched (fetch errors and partition ends handled, not returned): what is
        here; if nothing is, wait up to ``timeout_s`` for one, then take what came with it."""
        # consume(n) waits for n messages or the timeout, so it is only asked to wait for one.
        records = self._consumer.consume(self.batch_size, 0)
        if records and not any(map(_error_of, records)):
            return records  # the common case: one check for the whole fetch
        deadline_s = time.monotonic() + timeout_s
        while True:
            if any(map(_error_of, records)):
                for record in records:
                    self._handle_fetch_error(record)
                records = [record for record in records if record.error() is None]
            if records:
                return records
            # Nothing yet, or only partition ends: they do not end the wait. A long wait still
            # peeks at the parked partitions every interval.
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return []
            self._ack_flusher.flush_before_poll(waiting=True)  # before the wait, not after it
            if not self._fetching_held:
                self._parking.peek_if_due(self._not_waiting_for_due)
            records = self._consumer.consume(1, min(left_s, self._parking.until_peek_s()))
            if records and records[0].error() is None and self.batch_size > 1:
                records += self._consumer.consume(self.batch_size - 1, 0)

    def _hold_back_not_due(self, records: list[Message]) -> list[Message]:
        """Never early: retry-topic partitions stop at their first message not yet due.
        Queue-topic and redelivery messages are always due."""
        batches = group_by_source(records, record_source)
        gated = {source: batch for source, batch in batches.items() if source[0] in self._retry_set}
        ready = [r for source, batch in batches.items() if source not in gated for r in batch]
        return ready + self._gate.hold_back(gated, self._clock_ms(), _due_ms_of, record_offset)

    def _not_waiting_for_due(self, source: Source) -> bool:
        return not self._gate.is_paused(source)

    def _handle_fetch_error(self, record: Message) -> None:
        error = record.error()
        if error is None:
            return
        if error.code() == KafkaError._PARTITION_EOF:
            self._parking.reached_end(record_source(record))
            return
        self.stats.client_errors.record(error)
        if error.fatal():
            raise KafkaException(error)
        if means_topic_gone(error):
            self._topic_watch.check_now([record.topic() or self.queue.topic])

    def _restart(self, message: KmqMessage | Message, deadline_ms: int) -> None:
        """A new start marker for one message: it is in flight until ``deadline_ms``."""
        topic, partition, offset = _coordinates(message)
        self._markers.start([((topic, partition), offset, 1)], deadline_ms)
        self._markers.serve()

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The line operators (and the getting-started guide) wait for: work flows from here.
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        log.info(
            "assigned partitions: %s",
            "; ".join(f"{topic} {sorted(parts)}" for topic, parts in sorted(by_topic.items())),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Acks of revoked partitions stay valid (end markers name the message, not the owner);
        # write them before the new owner's tracker view moves on.
        log.info("partitions revoked: %s", [(p.topic, p.partition) for p in partitions])
        self.flush()
        self._batches.forget({(p.topic, p.partition) for p in partitions})
        self._gate.forget((p.topic, p.partition) for p in partitions)
        self._parking.forget((p.topic, p.partition) for p in partitions)

    def _on_commit(self, error: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        if error is not None:
            self.stats.commit_failures += 1
            log.warning("offset commit failed, messages may be delivered twice: %s", error)
