"""DLQ ingester: copies a group's dead-letter topic into the audit store, idempotently.

Rows are keyed by their DLQ coordinates (topic, partition, offset), so a record read twice is
stored once. Offsets are committed to Kafka only after the rows are committed to the store: a
crash in between re-reads some records, and the store ignores them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition
from sqlalchemy.exc import SQLAlchemyError

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.store import AuditStore, now
from kmq_dagster.core.dead_letter_formats import format_of
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.clients import ClientErrors, new_consumer, positions_after
from kmq_dagster.kafka.group_offsets import read_committed
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.topic_reader import read_to_end, records_and_ends

log = logging.getLogger(__name__)

BATCH = 1_000
#: Waits between attempts to store a batch while the audit store is down, growing to the last.
STORE_RETRY_WAITS_S = (0.5, 1.0, 2.0, 5.0)


def ingester_group(queue: Queue) -> str:
    """The consumer group the DLQ ingesters of ``queue`` share."""
    return f"{queue.dlq_topic}.kmq-ingester"


@dataclass
class IngestStats:
    read: int = 0
    stored: int = 0
    #: Records already in the store (re-read after a crash or a rerun).
    already_stored: int = 0
    #: Seconds from the first batch's arrival to the last batch's commit (joining the group
    #: and waiting for the first record do not count).
    busy_s: float = 0.0
    #: Attempts to store a batch that failed (the store was down); each was tried again.
    store_failures: int = 0


class DlqIngester:
    """Copy the opened queue's DLQ into ``store``."""

    def __init__(
        self,
        opened: OpenedQueue,
        store: AuditStore,
        *,
        consumer_group: str | None = None,
    ) -> None:
        self.queue = queue = opened.queue
        settings = opened.settings
        self.topic = queue.topic
        self.group = queue.group
        self.dlq_topic = queue.dlq_topic
        self.store = store
        self.stats = IngestStats()
        self.client_errors = ClientErrors()
        self._partitions = list(range(opened.dlq_partitions))
        self._consumer = new_consumer(
            settings,
            consumer_group or ingester_group(queue),
            **{"enable.partition.eof": True, "error_cb": self.client_errors.on_error},
        )
        # Progress lives in the ingester group's offsets, committed after the rows. A store
        # that never ingested this DLQ (new, recreated, another URL) would get nothing past
        # them: it reads the DLQ from its start instead (rows already there are skipped).
        # (Asked by run_ingest before it records its action, or on the first assignment: not
        # here, where building an ingester asks nothing.)
        self.from_start: bool | None = None
        self._rewound: set[int] = set()
        self._consumer.subscribe([self.dlq_topic], on_assign=self._on_assign)
        self._first_batch_at: float | None = None

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if self.from_start is None:
            self.from_start = not self.store.has_ingested(self.queue.topic, self.queue.group)
        if not self.from_start:
            return
        fresh = [p.partition for p in partitions if p.partition not in self._rewound]
        if not fresh:
            return
        log.info(
            "the audit store has no ingest of %s yet: reading %s from its start "
            "(dead letters it holds already are skipped)", self.queue, self.dlq_topic,
        )  # fmt: skip
        for partition in partitions:
            if partition.partition in fresh:
                partition.offset = OFFSET_BEGINNING
        self._rewound.update(fresh)
        consumer.assign(partitions)

    def ingest_available(self, timeout_s: float = 60) -> IngestStats:
        """Ingest until every partition of the DLQ has been read to its end (EOF).

        Raises:
            KmqTimeoutError: not read to its end within ``timeout_s``.
        """
        for records in read_to_end(
            self._consumer,
            self._partitions,
            timeout_s=timeout_s,
            batch=BATCH,
            on_error=self.client_errors.record,
        ):
            self._store(records)
        return self.stats

    def describe_stats(self) -> str:
        """One line of the ingester's counters, for its log."""
        stats = self.stats
        return f"read {stats.read}, stored {stats.stored}, already stored {stats.already_stored}"

    def run(self, stop: threading.Event) -> None:
        """Ingest until ``stop`` is set. While the audit store is down, the batch at hand is
        tried again (with growing waits) and nothing more is read: nothing is skipped, and
        its offsets are committed only once it is stored."""
        try:
            while not stop.is_set():
                self._step(set(), stop)
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()

    def _step(self, at_end: set[int], stop: threading.Event) -> None:
        fetched = self._consumer.consume(BATCH, 0.5)
        records = records_and_ends(fetched, at_end, self.client_errors.record)
        attempt = 0
        while records and not stop.is_set():
            try:
                self._store(records)
                return
            except SQLAlchemyError as exc:
                self.stats.store_failures += 1
                wait_s = STORE_RETRY_WAITS_S[min(attempt, len(STORE_RETRY_WAITS_S) - 1)]
                log.warning(
                    "audit store unavailable (%s); trying the batch of %d again in %g s",
                    str(exc).splitlines()[0],
                    len(records),
                    wait_s,
                )
                attempt += 1
                stop.wait(wait_s)

    def _store(self, records: list[Message]) -> None:
        if self._first_batch_at is None:
            self._first_batch_at = time.monotonic()
        rows = dead_letter_rows(self.queue, records)
        stored = self.store.add_dead_letters(rows)
        self.stats.read += len(rows)
        self.stats.stored += stored
        self.stats.already_stored += len(rows) - stored
        self._commit(records)
        self.stats.busy_s = time.monotonic() - self._first_batch_at

    def _commit(self, records: list[Message]) -> None:
        """Only after the rows are stored: a crash before this re-reads, never loses."""
        try:
            self._consumer.commit(offsets=positions_after(records), asynchronous=False)
        except KafkaException as exc:
            # Stored already: the worst is reading these again, and the store ignores them.
            log.warning("DLQ offsets not committed (they will be read again): %s", exc)


def dead_letter_rows(queue: Queue, records: list[Message]) -> list[dict[str, Any]]:
    """Audit-store rows of ``queue``'s DLQ records, stamped as ingested now."""
    ingested_at = now()
    dead_letter_format = format_of(queue)
    return [
        dead_letter_row(
            dlq_topic=queue.dlq_topic,
            partition=record.partition() or 0,
            offset=record.offset() or 0,
            key=record.key(),
            value=record.value(),
            headers=normalize_headers(record.headers()),
            timestamp_ms=record.timestamp()[1],
            queue_topic=queue.topic,
            group_id=queue.group,
            ingested_at=ingested_at,
            dead_letter_format=dead_letter_format,
        )
        for record in records
    ]


def ingest_dead_letters(
    opened: OpenedQueue,
    store: AuditStore,
    *,
    max_records: int = 5_000,
    timeout_s: float = 10.0,
) -> IngestStats:
    """Copy up to ``max_records`` new dead letters of ``queue`` into ``store`` and return.

    Bounded work for a periodic caller (a Dagster sensor tick): it reads from the ingesters'
    committed offsets without joining their group, stores, then commits as a non-member. While
    a ``kmq ingest`` process holds the group, the group refuses that commit; the rows are stored
    all the same (idempotently), and the next call reads from wherever that process got to.

    Raises:
        KmqTimeoutError: the DLQ did not answer within ``timeout_s``.
    """
    settings, queue = opened.settings, opened.queue
    stats = IngestStats()
    partitions = range(opened.dlq_partitions)
    consumer = new_consumer(settings, ingester_group(queue), **{"enable.partition.eof": True})
    try:
        sources = [(queue.dlq_topic, p) for p in partitions]
        committed = read_committed(consumer, sources, settings.request_timeout_ms / 1000)
        consumer.assign(
            [TopicPartition(topic, p, offset or 0) for (topic, p), offset in committed.items()]
        )
        records: list[Message] = []
        try:
            for batch in read_to_end(consumer, partitions, timeout_s=timeout_s, batch=BATCH):
                records += batch
                if len(records) >= max_records:
                    break
        except KmqTimeoutError:
            if not records:
                raise
        if records:
            stats.read = len(records)
            stats.stored = store.add_dead_letters(dead_letter_rows(queue, records))
            stats.already_stored = stats.read - stats.stored
            try:
                consumer.commit(offsets=positions_after(records), asynchronous=False)
            except KafkaException as exc:
                log.info("ingest commit refused (a kmq ingest process holds the group?): %s", exc)
    finally:
        consumer.close()
    return stats
