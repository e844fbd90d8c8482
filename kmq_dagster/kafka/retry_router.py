"""Moves failed messages to their retry topic, or to the DLQ, before they are acknowledged.

A failed message is copied (key, value and user headers kept, ``kmq-*`` headers set) to the
group's retry topic for its next delay, or to the group's DLQ once the policy gives up. Only
after the broker has acknowledged the copy is the original acknowledged; a copy that could not
be written leaves the original unacknowledged, so the tracker redelivers it. A copy refused
for its size is dead-lettered as a reference (``kafka.oversize``), acknowledged the same way.
"""

from __future__ import annotations

import logging
import os
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from kmq_dagster.core.headers import (
    ERROR_TYPE,
    REDELIVERY_COUNT,
    has_kmq_headers,
    replace_headers,
)
from kmq_dagster.core.masking import masker_from_env
from kmq_dagster.core.oversize import ValueRef
from kmq_dagster.core.retry import DeadLetter, Retry
from kmq_dagster.core.retry_headers import (
    ATTEMPT,
    CORRUPT_RETRY_METADATA,
    DUE_MS,
    Failure,
    copy_headers,
    origin_of,
    read_attempt,
    read_due_ms,
    read_first_failure_ms,
)
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import COPY_ANSWER_TIMEOUT_S, DELIVERY_TIMEOUT_S, Deliveries
from kmq_dagster.kafka.message import QueueMessage, fetched_value, origin_or_own
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.oversize import References, RefusedCopy, is_size_refusal, size_refusal
from kmq_dagster.tracing import copied_headers, tracing_active

log = logging.getLogger(__name__)

M = TypeVar("M", bound=QueueMessage)


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming what went wrong when that raises: an exception
    that cannot be rendered must still reach its retry topic or the DLQ (invariant 7), not
    crash the worker that caught it."""
    try:
        return str(exc)
    except Exception as rendering:
        return f"<{type(exc).__name__}: str() raised {type(rendering).__name__}>"


def logged_error_text(exc: BaseException) -> str:
    """:func:`error_text` masked for a log line: error text is data (invariant 13), and
    ``raise ValueError(f"rejected: {order}")`` puts the message's secrets into it."""
    return masker_from_env(os.environ).mask_text(error_text(exc))[0]


def failure_of(exc: BaseException) -> Failure:
    """What an exception says, for the headers of a copy (never raises)."""
    try:
        trace = "".join(traceback.format_exception(exc)).rstrip()
    except Exception as rendering:  # a __repr__ or note that raises: the type is enough
        trace = f"<traceback of {type(exc).__name__} not rendered: {type(rendering).__name__}>"
    return Failure(type(exc).__name__, error_text(exc), trace)


@dataclass(frozen=True)
class GiveUp:
    """A failure whose retries were spent elsewhere (in place, by a key-ordered worker): the
    DLQ copy carries ``decision``'s attempt and reason rather than the headers' attempt, and
    ``first_failure_ms`` (the first of those attempts' failures) rather than now."""

    failure: Failure
    decision: DeadLetter
    first_failure_ms: int | None = None


@dataclass
class RouterStats:
    retried: int = 0
    dead_lettered: int = 0
    corrupt: int = 0
    write_failures: int = 0
    #: Copies refused for their size, dead-lettered as references instead.
    oversize: int = 0


class RetryRouter:
    """Retry and dead-letter routing of the opened queue's failed messages, by its retry
    policy (whose ``non_retryable`` error types go straight to the DLQ).

    Args:
        producer: the producer to write copies with (a fake in unit tests); by default one of
            its own, made from the queue's settings.
    """

    def __init__(
        self,
        opened: OpenedQueue,
        *,
        clock_ms: Callable[[], int],
        rng: random.Random | None = None,
        producer: Producer | None = None,
    ) -> None:
        self.queue = queue = opened.queue
        self.group = queue.group
        self.policy = queue.retry_policy
        self.retry_topics = queue.retry_topics
        self._retry_topic_names = frozenset(self.retry_topics.values())
        self.dlq_topic = queue.dlq_topic
        #: Partitions of the retry topics and the DLQ (the queue's auxiliary count).
        self.aux_partitions = queue.aux_partition_count or 1
        self.stats = RouterStats()
        self._clock_ms = clock_ms
        self._rng = rng or random.Random()
        self._producer = producer if producer is not None else new_producer(opened.settings)

    def metadata_problem(self, message: QueueMessage) -> str | None:
        """Why a retried message's ``kmq-*`` headers cannot be trusted, or ``None``.

        Messages from a retry topic must carry a readable attempt and due time.
        """
        headers = message.headers
        from_retry_topic = message.topic in self._retry_topic_names
        if not from_retry_topic and not has_kmq_headers(headers):
            return None  # a first delivery: nothing to read (the common case, made cheap)
        try:
            attempt = read_attempt(headers)
            due_ms = read_due_ms(headers)
            origin_of(
                headers, message.topic, message.partition, message.offset, message.timestamp_ms
            )
        except ValueError as exc:
            return f"{CORRUPT_RETRY_METADATA}: {exc}"
        if from_retry_topic and (due_ms is None or attempt < 2):
            return f"{CORRUPT_RETRY_METADATA}: {ATTEMPT} or {DUE_MS} missing"
        return None

    def route(self, failed: Sequence[tuple[M, Failure | str | GiveUp]]) -> list[M]:
        """Copy each failed message to its retry topic or the DLQ (a ``str`` or a
        :class:`GiveUp` goes to the DLQ with its reason).

        Returns:
            The messages whose copy the broker acknowledged: only these may be acked.
        """
        copies = Deliveries(self._producer)
        # A copy refused for its size goes to the DLQ as a reference instead (core.oversize).
        references: References[int] = References(self._producer, self.dlq_topic)
        planned: list[tuple[str, list[tuple[str, bytes | None]]]] = []
        for index, (message, failure) in enumerate(failed):
            target, updates = self._plan(message, failure)
            headers = replace_headers(message.headers, updates)
            if tracing_active():
                headers = self._traced(message, target, headers, updates)
            planned.append((target, headers))
            try:
                copies.produce(
                    target,
                    key=message.key,
                    value=fetched_value(message),  # as fetched, whatever a handler set
                    headers=planned[index][1],
                    # the message's partition, folded into the target's count (Queue.partition_for)
                    partition=message.partition % self.aux_partitions,
                )
            except KafkaException as exc:
                refusal = size_refusal(exc)
                if refusal is None:
                    raise
                references.write(index, self._refused(message, *planned[index], refusal))
        delivered = copies.wait(COPY_ANSWER_TIMEOUT_S).delivered
        for index, error in copies.failed.items():
            if is_size_refusal(error):
                references.write(index, self._refused(failed[index][0], *planned[index], error))
            else:
                log.warning("retry copy not written: %s", error.str())
        delivered |= set(references.delivered())
        self.stats.oversize += references.refused
        routed = [message for index, (message, _) in enumerate(failed) if index in delivered]
        self.stats.write_failures += len(failed) - len(routed)
        return routed

    def _refused(
        self,
        message: QueueMessage,
        target: str,
        headers: list[tuple[str, bytes | None]],
        refusal: KafkaError,
    ) -> RefusedCopy:
        source = ValueRef(message.topic, message.partition, message.offset)
        partition = message.partition % self.aux_partitions
        value = fetched_value(message)
        return RefusedCopy(source, target, message.key, value, headers, partition, refusal)

    def _plan(
        self, message: QueueMessage, failure: Failure | str | GiveUp
    ) -> tuple[str, dict[str, str]]:
        headers = message.headers
        # Unreadable origin headers: the copy names where it was read.
        origin = origin_or_own(message)
        now_ms = self._clock_ms()
        first_ms = read_first_failure_ms(headers, now_ms)
        if isinstance(failure, str):  # corrupt metadata: straight to the DLQ
            self.stats.corrupt += 1
            self.stats.dead_lettered += 1
            bare = Failure("CorruptRetryMetadata", failure)
            updates = copy_headers(
                origin, self.group, bare, dlq_reason=failure, first_failure_ms=first_ms
            )
            return self.dlq_topic, {**updates}
        decision: Retry | DeadLetter
        if isinstance(failure, GiveUp):
            first_ms = failure.first_failure_ms or first_ms
            decision = failure.decision
            failure = failure.failure
            attempt = decision.attempt
        else:
            attempt = read_attempt(headers)
            decision = self.policy.after_failure(
                attempt, failure.error_type, now_ms, self._rng, failure.error_message
            )
        if isinstance(decision, DeadLetter):
            self.stats.dead_lettered += 1
            updates = copy_headers(
                origin,
                self.group,
                failure,
                attempt=attempt,
                dlq_reason=decision.reason,
                first_failure_ms=first_ms,
            )
            return self.dlq_topic, {**updates}
        self.stats.retried += 1
        updates = copy_headers(
            origin,
            self.group,
            failure,
            attempt=decision.attempt,
            due_ms=decision.due_ms,
            first_failure_ms=first_ms,
        )
        # A new hop: redeliveries of the copy count from zero again.
        return self.retry_topics[decision.topic_delay_ms], {**updates, REDELIVERY_COUNT: "0"}

    def _traced(
        self,
        message: QueueMessage,
        target: str,
        headers: list[tuple[str, bytes | None]],
        updates: dict[str, str],
    ) -> list[tuple[str, bytes | None]]:
        """``headers`` with the trace context of a ``retry`` or ``dead-letter`` span."""
        attributes: dict[str, str | int] = {
            "messaging.consumer.group.name": self.group,
            "error.type": updates[ERROR_TYPE],
        }
        if ATTEMPT in updates:
            attributes["kmq.attempt"] = int(updates[ATTEMPT])
        operation = "dead-letter" if target == self.dlq_topic else "retry"
        source = (message.topic, message.partition, message.offset)
        return copied_headers(
            operation, target, headers, source=source, source_headers=message.headers,
            attributes=attributes,
        )  # fmt: skip

    def close(self) -> None:
        self._producer.flush(DELIVERY_TIMEOUT_S)
