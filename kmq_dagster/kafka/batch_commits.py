"""Steps 2 and 3 of the protocol (docs/design.md): the start markers of each fetched batch,
and its offsets committed only once the broker has acknowledged every one of them
(invariant 2: start before commit).

A batch whose start marker failed is not committed: its partitions are rewound, so the batch
is fetched again. Nothing waits for the markers: the batch is handed out at once, and each
poll commits what has become durable since the last one.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer, KafkaError, Message

from kmq_dagster.core.commits import CommitQueue
from kmq_dagster.core.ranges import OffsetRun, run_bounds
from kmq_dagster.kafka.consumer_stats import ConsumerStats
from kmq_dagster.kafka.group_offsets import apply_ready_offsets
from kmq_dagster.kafka.marker_writer import MarkerWriter

# The consumer's log: an operator reads the consumer's lines under one logger name.
log = logging.getLogger("kmq_dagster.kafka.consumer")


class BatchCommits:
    """Start markers of fetched batches out, their offsets committed once those are durable."""

    def __init__(self, consumer: Consumer, markers: MarkerWriter, stats: ConsumerStats) -> None:
        self._consumer = consumer
        self._markers = markers
        self._stats = stats
        self._commits = CommitQueue()
        # Delivery reports run on whichever thread serves the producer: poll, the ack
        # flusher, nack.
        self._lock = threading.Lock()

    def start(self, runs: list[OffsetRun], deadline_ms: int) -> None:
        """2. Send the start markers of a fetched batch; 3. happens in :meth:`settle`."""
        with self._lock:
            batch_id = self._commits.add(run_bounds(runs), markers=len(runs))

        def on_delivery(error: KafkaError | None, _record: Message) -> None:
            if error is not None:
                self._stats.marker_write_failures += 1
                log.warning("start marker not written (%s); batch will be fetched again", error)
            with self._lock:
                self._commits.marker_delivered(batch_id, ok=error is None)

        starts = self._markers.start(runs, deadline_ms, on_delivery)
        self._stats.fetched += sum(count for _, _, count in runs)
        self._stats.start_markers += len(starts)

    def settle(self, asynchronous: bool = True) -> None:
        """3. Commit batches whose start markers are durable; re-fetch those that failed."""
        self._markers.serve()  # marker delivery reports: what may be committed
        with self._lock:
            ready = self._commits.take_ready()
        failure = apply_ready_offsets(self._consumer, ready, asynchronous=asynchronous)
        if failure is not None:
            # Start markers are written: if the partition moved, its new owner re-reads these
            # messages (duplicates, never losses), and the tracker covers them meanwhile.
            self._stats.commit_failures += 1
            log.warning("offset commit failed, messages may be delivered twice: %s", failure)

    def forget(self, partitions: set[tuple[str, int]]) -> None:
        """Drop the batches of revoked ``(topic, partition)``s: their new owner commits them."""
        with self._lock:
            self._commits.forget(partitions)
