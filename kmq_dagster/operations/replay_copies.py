"""The copies a DLQ replay writes: to its target topic, at its rate, waited for as one chunk.

The write half of a replay; ``kmq_dagster.operations.replay`` selects the dead letters and keeps the
replay's progress. A copy carries the replay's headers (its replay count raised, the attempt
and error headers of its last failure dropped) and goes to the partition that keeps its key's
order. No copy of a chunk counts as replayed until the broker has acknowledged them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaException, Message

from kmq_dagster.audit.history import ReplayedCopy
from kmq_dagster.core.dead_letter_formats import EACH_ORIGINAL_TOPIC, KMQ, reading_headers
from kmq_dagster.core.headers import (
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    header_value,
    normalize_headers,
    replace_headers,
)
from kmq_dagster.core.oversize import REFERENCE_HEADERS, record_size
from kmq_dagster.core.pacing import Pacer
from kmq_dagster.core.replay import TO_RETRY, read_replay_count, replay_headers
from kmq_dagster.core.replay_request import ReplayRequest
from kmq_dagster.errors import DeliveryError
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S, Deliveries
from kmq_dagster.kafka.oversize import size_refusal
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import copied_headers, tracing_active


class ReplayCopier:
    """Writes the copies of one replay's dead letters to ``target`` (see the module docstring).

    Args:
        target: the topic every copy goes to, or
            :data:`~kmq_dagster.core.dead_letter_formats.EACH_ORIGINAL_TOPIC`: each to the
            original topic its headers name (read in ``dead_letter_format``).
        partitions: how many partitions the queue topic has (a copy back to it keeps its
            original partition when that is one of them).
        clock_ms: the clock a copy's replay time is read from (ms since the epoch).
    """

    def __init__(
        self,
        settings: KmqSettings,
        request: ReplayRequest,
        target: str,
        partitions: int,
        *,
        clock_ms: Callable[[], int],
        dead_letter_format: str = KMQ,
    ) -> None:
        self.request = request
        self.dead_letter_format = dead_letter_format
        self.target = target
        self.partitions = partitions
        self.clock_ms = clock_ms
        self.producer = new_producer(settings)
        limit = settings.producer_config()["message.max.bytes"]
        #: The producer's size limit (``None``: a value librdkafka refused already).
        self.limit_bytes = limit if isinstance(limit, int) else None
        rate = request.rate_per_s
        self._pacer = None if rate is None else Pacer(rate)

    def refuse_oversize(
        self, records: list[Message], values: dict[tuple[int, int], bytes | None]
    ) -> None:
        """Raise before any effect (no intent recorded, nothing sent) when a copy would be
        over the producer's size limit.

        Raises:
            DeliveryError: names the first dead letter whose copy is too large.
        """
        if self.limit_bytes is None:
            return
        for record in records:
            at = (record.partition() or 0, record.offset() or 0)
            value = values.get(at, record.value())
            size = record_size(record.key(), value, normalize_headers(record.headers()))
            if size > self.limit_bytes:
                raise DeliveryError(_too_large(record, at, value, f"{self.limit_bytes:,} bytes"))

    def write(
        self,
        records: list[Message],
        replays: dict[tuple[int, int], int] | None = None,
        values: dict[tuple[int, int], bytes | None] | None = None,
    ) -> list[ReplayedCopy]:
        """Write copies of ``records`` and wait for the broker; returns where each went.

        Args:
            replays: per (partition, offset), the replays the audit store recorded against a
                dead letter by other requests; added to its header's replay count.
            values: per (partition, offset), the value a reference dead letter stands for
                (``kafka.reference_resolver``), copied instead of its empty one.

        Raises:
            DeliveryError: the broker refused a copy or did not answer in time, or a copy is
                over the producer's size limit.
        """
        copies = Deliveries(self.producer)
        for record in records:
            self._wait_for_rate()
            headers = normalize_headers(record.headers())
            read_as = reading_headers(self.dead_letter_format, headers)
            at = (record.partition() or 0, record.offset() or 0)
            earlier = (replays or {}).get(at, 0)
            count = read_replay_count(headers) + earlier
            plan = replay_headers(self.request.target, count, self.clock_ms())
            # A resolved reference is the message again: it loses the reference's headers.
            dropped = (*plan.drop, *REFERENCE_HEADERS)
            kept = [(k, v) for k, v in headers if k not in dropped]
            value = (values or {}).get(at, record.value())
            target = self._target_of(read_as)
            copy_headers = replace_headers(kept, plan.updates)
            if tracing_active():
                source = (record.topic() or "", *at)
                copy_headers = copied_headers(
                    "replay", target, copy_headers, source=source, source_headers=headers
                )
            try:
                copies.produce(
                    target,
                    key=record.key(),
                    value=value,
                    headers=copy_headers,
                    partition=self._target_partition(record, read_as, target),
                )
            except KafkaException as exc:
                refusal = size_refusal(exc)
                if refusal is None:
                    raise
                raise DeliveryError(_too_large(record, at, value, refusal.str())) from None
            self.producer.poll(0)
        try:
            copies.wait_all("replayed copies")
        except DeliveryError as exc:
            raise DeliveryError(
                f"{exc}; nothing after them was marked done: run the same replay again to resume"
            ) from None
        return [
            ReplayedCopy(record.partition() or 0, record.offset() or 0, *copies.written[index])
            for index, record in enumerate(records)
        ]

    def _target_of(self, headers: list[tuple[str, bytes | None]]) -> str:
        """Where a copy goes: the replay's topic, or the original topic its headers name
        (replay leaves dead letters without one in the DLQ before they get here)."""
        if self.target != EACH_ORIGINAL_TOPIC:
            return self.target
        original = header_value(headers, ORIGINAL_TOPIC)
        if not original:
            raise DeliveryError("a dead letter without an original topic reached the copier")
        return original.decode("utf-8", errors="replace")

    def _target_partition(
        self, record: Message, headers: list[tuple[str, bytes | None]], target: str
    ) -> int | None:
        """The DLQ partition for the group's redelivery topic (both have the queue's
        auxiliary count); the original partition when going back to the queue topic, so a key
        keeps its partition (else the DLQ partition: the auxiliary count is at most the queue's).
        A foreign dead letter goes back to its original partition (the original topic has at
        least that many: Kafka never takes partitions away); to a chosen topic, the
        producer's partitioner places it."""
        if self.request.target == TO_RETRY and self.request.to_topic is None:
            return record.partition() or 0
        original_topic = header_value(headers, ORIGINAL_TOPIC)
        original = header_value(headers, ORIGINAL_PARTITION)
        foreign = self.dead_letter_format != KMQ or self.target == EACH_ORIGINAL_TOPIC
        if original_topic == target.encode() and original and original.isdigit():
            partition = int(original)
            if foreign or partition < self.partitions:
                return partition
        return None if foreign or self.request.to_topic is not None else record.partition() or 0

    def _wait_for_rate(self) -> None:
        if self._pacer is None:
            return
        wait_s = self._pacer.wait_s()
        if wait_s > 0:
            self.producer.poll(0)
            time.sleep(wait_s)

    def close(self) -> None:
        """Flush what the producer still holds (copies of a chunk that failed)."""
        self.producer.flush(DELIVERY_TIMEOUT_S)


def _too_large(record: Message, at: tuple[int, int], value: bytes | None, limit: str) -> str:
    return (
        f"the copy of dead letter {record.topic()} [{at[0]}] @ {at[1]} ({len(value or b''):,} "
        f"bytes of value) is over the producer's limit ({limit}); replay it with a larger "
        "-X message.max.bytes=N (the broker's and the topic's limits must allow it too)"
    )
