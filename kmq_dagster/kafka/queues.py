"""Opening a provisioned queue: its stored definition and its topics, checked once.

Opening returns an :class:`~kmq_dagster.kafka.opened_queue.OpenedQueue`, the one object every
component takes; none of them checks the queue again.

Examples:
    >>> opened = open_queue(settings, "orders", "billing")          # doctest: +SKIP
    >>> opened.queue.retry_policy.delays_ms                         # doctest: +SKIP
    (10000, 60000, 600000)
"""

from __future__ import annotations

from kmq_dagster.core.queue import Queue, conflicts, describe_conflicts
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.errors import QueueConflictError
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.provision_plan import aux_topic_names
from kmq_dagster.kafka.registry import Registered, load_registry
from kmq_dagster.settings import KmqSettings

__all__ = ["OpenedQueue", "open_declared_queue", "open_queue", "open_queues"]


def open_queue(
    settings: KmqSettings,
    topic: str,
    group: str,
    *,
    retry_policy: RetryPolicy | None = None,
    visibility_timeout_ms: int | None = None,
    max_redeliveries: int | None = None,
    partitions: int | None = None,
    value_format: ValueFormat | None = None,
    key_format: ValueFormat | None = None,
) -> OpenedQueue:
    """The queue ``topic``/``group`` as it was provisioned, its topics checked.

    Values given here (``None``: not given) must agree with the stored definition; the retry
    policy's ``non_retryable`` error types are the caller's and are always kept.

    Raises:
        ProvisionError: the queue was never provisioned, or some of its topics are missing.
        QueueConflictError: a given value contradicts the stored definition, or the queue's
            topics belong to another queue.
        KafkaUnavailableError: the cluster did not answer.
    """
    registered = load_registry(settings)
    stored = _stored(settings, registered, topic, group)
    differences = stored.contradictions(
        retry_policy=retry_policy,
        visibility_timeout_ms=visibility_timeout_ms,
        max_redeliveries=max_redeliveries,
        value_format=value_format,
        key_format=key_format,
    )
    if differences:
        raise QueueConflictError(
            f"queue {stored} is provisioned with other settings: {'; '.join(differences)}; "
            "leave them out to use the stored ones, or provision it again to redefine it"
        )
    opened = _checked(settings, stored)
    if partitions is not None and partitions != opened.partitions:
        raise QueueConflictError(
            f"queue {stored} has {opened.partitions} partitions, not {partitions}"
        )
    if retry_policy is not None and retry_policy.non_retryable:
        return opened.with_non_retryable(retry_policy.non_retryable)
    return opened


def open_declared_queue(settings: KmqSettings, declared: Queue) -> OpenedQueue:
    """``declared`` opened: its stored definition must be the one declared (a queue declared
    in code, e.g. for Dagster, is provisioned with exactly its values).

    Raises:
        As :func:`open_queue`.
    """
    return open_queue(
        settings,
        declared.topic,
        declared.group,
        partitions=declared.partitions,
        **declared.fixed_settings(),
    )


def open_queues(
    settings: KmqSettings, *, topic: str | None = None, group: str | None = None
) -> list[OpenedQueue]:
    """Every provisioned queue (of ``topic``, of ``group`` when given), sorted by topic and
    group; one read of the registry for all of them.

    Raises:
        ProvisionError: some of a queue's topics are missing.
        KafkaUnavailableError: the cluster did not answer.
    """
    registered = load_registry(settings)
    return [
        _checked(settings, stored)
        for (queue_topic, queue_group), stored in sorted(registered.queues.items())
        if topic in (None, queue_topic) and group in (None, queue_group)
    ]


def _stored(settings: KmqSettings, registered: Registered, topic: str, group: str) -> Queue:
    """The stored definition of ``topic``/``group``; a clear error when there is none."""
    stored = registered.queues.get((topic, group))
    if stored is not None:
        return stored
    clashes = conflicts(Queue(topic, group), registered.queues.values(), registered.topics)
    if clashes:
        raise QueueConflictError(
            f"{topic} / {group} is not a queue of its own: its topic names are taken "
            f"({describe_conflicts(clashes)})"
        )
    # Never provisioned: report which of its topics are missing, and the fix.
    require_topics(
        settings,
        topic,
        [Queue(topic, group).markers_topic],
        fix=f"kmq provision --topic {topic} --group {group}",
    )
    raise QueueConflictError(
        f"queue {topic} / {group} has no stored definition (provisioned by an older kmq?); "
        f"run `kmq provision --topic {topic} --group {group}` with its retry options to "
        "record it"
    )


def _checked(settings: KmqSettings, stored: Queue) -> OpenedQueue:
    """``stored`` with its topics checked and its partition count read from the cluster."""
    partitions = require_topics(
        settings,
        stored.topic,
        [stored.markers_topic],
        fix=f"kmq provision --topic {stored.topic} --group {stored.group}",
        aux=aux_topic_names(stored),
        aux_partitions=stored.aux_partitions,
    )
    return vouch_for(settings, stored.replace(partitions=partitions))
