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

from confluent_kafka import Consumer, Message

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.store import AuditStore, now
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.naming import dlq_topic
from kmq_dagster.kafka.clients import CLIENT_LOGGER, ClientErrors, commit_offsets, positions_after
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.topic_reader import records_and_ends
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

BATCH = 1_000


def ingester_group(topic: str, group: str) -> str:
    return f"{dlq_topic(topic, group)}.kmq-ingester"


@dataclass
class IngestStats:
    read: int = 0
    stored: int = 0
    #: Records already in the store (re-read after a crash or a rerun).
    already_stored: int = 0
    #: Seconds from the first batch's arrival to the last batch's commit (joining the group
    #: and waiting for the first record do not count).
    busy_s: float = 0.0


class DlqIngester:
    """Copy ``topic``/``group``'s DLQ into ``store``."""

    def __init__(
        self,
        settings: KmqSettings,
        store: AuditStore,
        topic: str,
        group: str,
        *,
        consumer_group: str | None = None,
    ) -> None:
        self.topic = topic
        self.group = group
        self.dlq_topic = dlq_topic(topic, group)
        self.store = store
        self.stats = IngestStats()
        self.client_errors = ClientErrors()
        partitions = require_topics(settings, topic, [self.dlq_topic], options=f" --group {group}")
        self._partitions = list(range(partitions))
        self._consumer = Consumer(
            settings.consumer_config(
                consumer_group or ingester_group(topic, group),
                **{
                    "enable.partition.eof": True,
                    "logger": CLIENT_LOGGER,
                    "error_cb": self.client_errors.on_error,
                },
            )
        )
        self._consumer.subscribe([self.dlq_topic])
        self._first_batch_at: float | None = None

    def ingest_available(self, timeout_s: float = 60) -> IngestStats:
        """Ingest until every partition of the DLQ has been read to its end (EOF)."""
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(self._partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.dlq_topic} not read to its end within {timeout_s} s")
            self._step(at_end)
        return self.stats

    def run(self, stop: threading.Event) -> None:
        """Ingest until ``stop`` is set."""
        try:
            while not stop.is_set():
                self._step(set())
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()

    def _step(self, at_end: set[int]) -> None:
        fetched = self._consumer.consume(BATCH, 0.5)
        records = records_and_ends(fetched, at_end, self.client_errors.record)
        if records:
            self._store(records)

    def _store(self, records: list[Message]) -> None:
        if self._first_batch_at is None:
            self._first_batch_at = time.monotonic()
        ingested_at = now()
        rows = [
            dead_letter_row(
                dlq_topic=self.dlq_topic,
                partition=record.partition() or 0,
                offset=record.offset() or 0,
                key=record.key(),
                value=record.value(),
                headers=normalize_headers(record.headers()),
                timestamp_ms=record.timestamp()[1],
                queue_topic=self.topic,
                group_id=self.group,
                ingested_at=ingested_at,
            )
            for record in records
        ]
        stored = self.store.add_dead_letters(rows)
        self.stats.read += len(rows)
        self.stats.stored += stored
        self.stats.already_stored += len(rows) - stored
        commit_offsets(self._consumer, positions_after(records), wait=True)
        self.stats.busy_s = time.monotonic() - self._first_batch_at
