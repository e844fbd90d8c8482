"""Copies refused for their size, dead-lettered as references instead (``core.oversize``).

The retry router and the redelivery tracker copy records they read; a copy the producer
refuses at once (``produce()`` raises ``MSG_SIZE_TOO_LARGE``: over the client's
``message.max.bytes``) or the broker refuses later (the same code in the delivery report: over
the broker's or the topic's limit) is replaced by a reference on the group's DLQ. The caller
acknowledges the original only once the broker has acknowledged the reference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from kmq_dagster.core.headers import DLQ_REASON, Headers, header_value, replace_headers
from kmq_dagster.core.oversize import (
    ValueRef,
    oversize_reason,
    record_size,
    reference_updates,
)
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.kafka.clients import kafka_error_of, kafka_error_text
from kmq_dagster.kafka.delivery import COPY_ANSWER_TIMEOUT_S, Deliveries

log = logging.getLogger(__name__)

#: Error codes meaning "this record is too large": the client's check, or the broker's.
_SIZE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})

T = TypeVar("T")


def is_size_refusal(error: KafkaError) -> bool:
    """True if ``error`` refuses a record for its size."""
    return error.code() in _SIZE_CODES


def size_refusal(exc: KafkaException) -> KafkaError | None:
    """The size refusal ``exc`` carries (``produce()`` raised it), or ``None``."""
    error = kafka_error_of(exc)
    return error if error is not None and is_size_refusal(error) else None


@dataclass(frozen=True)
class RefusedCopy:
    """A copy of the record at ``source`` that was refused for its size."""

    source: ValueRef
    target: str
    key: bytes | None
    value: bytes | None
    #: The headers the copy would have carried (user headers and kmq's).
    headers: Headers
    #: The DLQ partition for its reference: the refused copy's (retry, redelivery and
    #: dead-letter topics share the queue's auxiliary partition count).
    partition: int
    refusal: KafkaError


class References(Generic[T]):
    """References written to ``dlq_topic`` in place of refused copies, awaited together;
    each is tagged with what the caller acknowledges once it is durable."""

    def __init__(self, producer: Producer, dlq_topic: str) -> None:
        self._deliveries = Deliveries(producer)
        self._dlq_topic = dlq_topic
        self._tags: dict[int, T] = {}
        #: Refused copies handed to :meth:`write`, whether or not a reference could be made.
        self.refused = 0

    def write(self, tag: T, refused: RefusedCopy) -> None:
        """Produce the reference for ``refused`` (not waited for: see :meth:`delivered`)."""
        self.refused += 1
        size = record_size(refused.key, refused.value, refused.headers)
        reason = oversize_reason(size, refused.target, refused.refusal.str(), refused.source)
        earlier = header_value(refused.headers, DLQ_REASON)
        if earlier:  # it was on its way to the DLQ: say why too
            reason += f"; dead-lettered because: {earlier.decode(errors='replace')}"
        log.warning("%s", reason)
        updates = reference_updates(refused.source, size, reason)
        # A dead letter is not due anywhere; its failure headers stay as the copy had them.
        headers = [(name, value) for name, value in refused.headers if name != DUE_MS]
        try:
            index = self._deliveries.produce(
                self._dlq_topic,
                key=refused.key,
                value=b"",
                headers=replace_headers(headers, updates),
                partition=refused.partition,
            )
        except KafkaException as exc:
            if size_refusal(exc) is None:
                raise
            # Its key or headers alone are over the limit: the original stays unacknowledged
            # (so it is redelivered, never lost) and the operator is told why.
            log.error(
                "cannot dead-letter even a reference to %s: its key and headers are over "
                "the producer's limit (%s); it stays unacknowledged",
                refused.source.describe(),
                kafka_error_text(exc),
            )
            return
        self._tags[index] = tag

    def delivered(self, timeout_s: float = COPY_ANSWER_TIMEOUT_S) -> list[T]:
        """Wait for the broker; the tags of the references it acknowledged."""
        if not self._tags:
            return []
        done = self._deliveries.wait(timeout_s).delivered
        for error in self._deliveries.failed.values():
            log.warning("reference dead letter not written: %s", error.str())
        return [tag for index, tag in self._tags.items() if index in done]
