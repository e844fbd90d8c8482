"""Opening a provisioned queue: its stored definition, checked once per process.

Examples:
    >>> queue = open_queue(settings, "orders", "billing")          # doctest: +SKIP
    >>> queue.retry_policy.delays_ms                                # doctest: +SKIP
    (10000, 60000, 600000)
"""

from __future__ import annotations

import dataclasses
import json
import threading

from kmq_dagster.core.queue import Queue, conflicts, describe_conflicts
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import QueueConflictError
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.registry import load_registry
from kmq_dagster.settings import KmqSettings

#: Queues this process has checked against the registry and the cluster, by connection.
_checked: dict[tuple[str, str, str], Queue] = {}
_checked_lock = threading.Lock()


def open_queue(
    settings: KmqSettings,
    topic: str,
    group: str,
    *,
    retry_policy: RetryPolicy | None = None,
    visibility_timeout_ms: int | None = None,
    max_redeliveries: int | None = None,
) -> Queue:
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
    stored = registered.queues.get((topic, group))
    if stored is None:
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
    differences = stored.contradictions(
        retry_policy=retry_policy,
        visibility_timeout_ms=visibility_timeout_ms,
        max_redeliveries=max_redeliveries,
    )
    if differences:
        raise QueueConflictError(
            f"queue {stored} is provisioned with other settings: {'; '.join(differences)}; "
            "leave them out to use the stored ones, or provision it again to redefine it"
        )
    queue = stored
    if retry_policy is not None and retry_policy.non_retryable:
        queue = stored.replace(
            retry_policy=stored.retry_policy.with_non_retryable(retry_policy.non_retryable)
        )
    partitions = require_topics(
        settings,
        topic,
        [*queue.group_topics],
        fix=f"kmq provision --topic {topic} --group {group}",
    )
    queue = queue.replace(partitions=partitions)
    with _checked_lock:
        _checked[_key(settings, queue)] = queue
    return queue


def ensure_provisioned(settings: KmqSettings, queue: Queue) -> Queue:
    """``queue`` as stored and checked (once per process): components call this with the
    queue they are given, so a queue built by hand must agree with what was provisioned.

    Raises:
        As :func:`open_queue`.
    """
    with _checked_lock:
        known = _checked.get(_key(settings, queue))
    if known is not None:
        return known
    opened = open_queue(
        settings,
        queue.topic,
        queue.group,
        retry_policy=queue.retry_policy,
        visibility_timeout_ms=queue.visibility_timeout_ms,
        max_redeliveries=queue.max_redeliveries,
    )
    if queue.partitions is not None and queue.partitions != opened.partitions:
        raise QueueConflictError(
            f"queue {queue} has {opened.partitions} partitions, not {queue.partitions}"
        )
    with _checked_lock:
        _checked[_key(settings, queue)] = opened
    return opened


def _key(settings: KmqSettings, queue: Queue) -> tuple[str, str, str]:
    """Identity of a checked queue: where it lives and everything that defines it."""
    policy = dataclasses.asdict(queue.retry_policy)
    policy["non_retryable"] = sorted(policy["non_retryable"])
    definition = {**queue.definition(), "partitions": None, "policy": policy}
    return (settings.bootstrap_servers, settings.registry_topic, json.dumps(definition))
