"""Reading a queue's dead letters straight from its DLQ topic (``kmq dlq list`` / ``show``):
no audit store needed, the same selection as a replay.
"""

from __future__ import annotations

from base64 import b64decode
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.store import now
from kmq_dagster.core.dead_letter_formats import TRACEBACK_HEADERS, format_of, reading_headers
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import ReplaySelection, read_replay_count
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.record_reader import RecordReader
from kmq_dagster.kafka.topic_reader import assigned_reader, read_to_end
from kmq_dagster.settings import KmqSettings

#: Longest a listing may take to read the DLQ to its end.
READ_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DeadLetterView:
    """One dead letter as it sits in the DLQ topic, with what its headers say."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    #: The columns the audit store would give it (error type, reason, attempts, origin, ...).
    row: dict[str, Any]

    @property
    def replay_count(self) -> int:
        return min(read_replay_count(self.headers), 2**31 - 1)

    @property
    def masked_headers(self) -> list[tuple[str, bytes | None]]:
        """The headers as the audit store keeps them: a secret's name shows the mask, secrets
        inside other values (the error message, the traceback) masked (invariant 13)."""
        return [
            (name, None if text is None else b64decode(text) if is_base64 else text.encode())
            for name, text, is_base64 in self.row["headers"]
        ]

    @property
    def traceback(self) -> str:
        """The stack text of the failure, masked."""
        found = dict(self.masked_headers)
        raw = next((found[name] for name in TRACEBACK_HEADERS if found.get(name)), None)
        return raw.decode("utf-8", errors="replace") if raw else ""


@dataclass
class DeadLetterPage:
    """The first dead letters a selection matches, and whether more match."""

    letters: list[DeadLetterView]
    scanned: int
    more: bool


def list_dead_letters(
    opened: OpenedQueue,
    selection: ReplaySelection | None = None,
    *,
    limit: int = 50,
) -> DeadLetterPage:
    """The first ``limit`` dead letters of the opened queue that ``selection`` matches, in DLQ order
    (partition by partition, oldest first within each).

    Raises:
        ConfigError: ``limit`` is not positive.
        KafkaUnavailableError: the cluster is not there.
    """
    if limit < 1:
        raise ConfigError(f"the limit must be at least 1, got {limit}", setting="limit")
    settings, queue = opened.settings, opened.queue
    matching = (selection or ReplaySelection()).resolved(wall_clock_ms())
    letters: list[DeadLetterView] = []
    scanned = 0
    for record in _every_record(settings, queue):
        scanned += 1
        view = _view(queue, record)
        read_as = reading_headers(format_of(queue), view.headers)
        if not matching.matches(view.partition, view.offset, view.key, read_as,
                                record.timestamp()[1]):  # fmt: skip
            continue
        if len(letters) == limit:
            return DeadLetterPage(letters, scanned, more=True)
        letters.append(view)
    return DeadLetterPage(letters, scanned, more=False)


def show_dead_letter(opened: OpenedQueue, partition: int, offset: int) -> DeadLetterView:
    """The dead letter at ``partition``/``offset`` of the opened queue's DLQ.

    Raises:
        ConfigError: no such partition, or no record at that offset.
    """
    settings, queue = opened.settings, opened.queue
    partitions = opened.dlq_partitions
    if not 0 <= partition < partitions:
        raise ConfigError(
            f"{queue.dlq_topic} has {partitions} partitions; no partition {partition}",
            setting="offsets",
        )
    reader = RecordReader(settings, f"kmq-dlq-show.{queue.topic}.{queue.group}")
    try:
        found = reader.read(queue.dlq_topic, partition, [offset]).found.get(offset)
    finally:
        reader.close()
    if found is None:
        raise ConfigError(f"{queue.dlq_topic} holds no record at {partition}:{offset}")
    return _view(queue, found)


def _every_record(settings: KmqSettings, queue: Queue) -> Iterator[Message]:
    partitions = range(queue.dlq_partitions)
    consumer = assigned_reader(settings, queue.dlq_topic, dict.fromkeys(partitions, 0))
    try:
        for batch in read_to_end(consumer, partitions, timeout_s=READ_TIMEOUT_S):
            yield from batch
    finally:
        consumer.close()


def _view(queue: Queue, record: Message) -> DeadLetterView:
    headers = normalize_headers(record.headers())
    partition, offset = record.partition() or 0, record.offset() or 0
    row = dead_letter_row(
        dlq_topic=queue.dlq_topic, partition=partition, offset=offset, key=record.key(),
        value=record.value(), headers=headers, timestamp_ms=record.timestamp()[1],
        queue_topic=queue.topic, group_id=queue.group, ingested_at=now(),
        dead_letter_format=format_of(queue),
    )  # fmt: skip
    return DeadLetterView(partition, offset, record.key(), record.value(), headers, row)
