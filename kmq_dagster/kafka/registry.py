"""Definitions of provisioned queues, kept in the registry topic so every process reads them.

Provisioning writes a queue's definition (its retry policy, visibility timeout, redeliveries and
partitions: :meth:`Queue.definition`) as a record keyed by topic and group; the last record per
key wins. Commands and Python code open a queue by name and get that definition, so the retry
policy is given once, when the queue is provisioned. The topic has one partition and
``cleanup.policy=compact`` (on Apache Kafka, compaction keeps the newest definition of every
queue for ever); kmq reads it to its end every time and never relies on compaction itself.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import cluster_metadata, new_producer
from kmq_dagster.kafka.delivery import Deliveries
from kmq_dagster.kafka.topic_reader import assigned_reader, read_to_end
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: Settings of the registry topic: definitions are never deleted by retention.
REGISTRY_TOPIC_CONFIG = {"cleanup.policy": "compact"}
_SEPARATOR = "\x00"
#: How long one read of the registry waits for more records before it looks for its end.
REGISTRY_POLL_S = 0.02


@dataclass
class Registered:
    """What the registry holds: defined queues, and queue topics provisioned without a group."""

    queues: dict[tuple[str, str], Queue] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)


def registry_exists(settings: KmqSettings) -> bool:
    return settings.registry_topic in cluster_metadata(settings).topics


def load_registry(settings: KmqSettings) -> Registered:
    """Every definition in the registry topic (none if it does not exist yet).

    A record that is not a definition is logged and skipped: it must not make every queue
    unusable.
    """
    registered = Registered()
    if not registry_exists(settings):
        return registered
    consumer = assigned_reader(settings, settings.registry_topic, {0: 0})
    try:
        # A short poll: the registry is small, and consume() waits out its whole poll for a
        # full batch, while every queue opening (a Dagster sensor tick's too) reads it.
        timeout_s = settings.request_timeout_ms / 1000
        for records in read_to_end(consumer, [0], timeout_s=timeout_s, poll_s=REGISTRY_POLL_S):
            for record in records:
                _apply(registered, record.key(), record.value(), record.offset() or 0)
    finally:
        consumer.close()
    return registered


def save_definition(settings: KmqSettings, queue: Queue) -> None:
    """Store ``queue``'s definition (its partitions must be known).

    Raises:
        DeliveryError: the broker did not acknowledge the record.
    """
    _save(settings, f"{queue.topic}{_SEPARATOR}{queue.group}", queue.definition())


def save_topic(settings: KmqSettings, topic: str, partitions: int) -> None:
    """Record a queue topic provisioned without a group."""
    _save(
        settings, f"{topic}{_SEPARATOR}", {"version": 1, "topic": topic, "partitions": partitions}
    )


def _save(settings: KmqSettings, key: str, definition: dict[str, Any]) -> None:
    producer = new_producer(settings)
    deliveries = Deliveries(producer)
    deliveries.produce(
        settings.registry_topic,
        key=key.encode(),
        value=json.dumps(definition).encode(),
        partition=0,
    )
    deliveries.wait_all("queue definitions")


def _apply(registered: Registered, key: bytes | None, value: bytes | None, offset: int) -> None:
    try:
        topic, separator, group = (key or b"").decode().partition(_SEPARATOR)
        if not separator:
            raise ValueError("no topic/group key")
        if value is None:  # a tombstone: the definition was removed
            if group:
                registered.queues.pop((topic, group), None)
            else:
                registered.topics.pop(topic, None)
            return
        stored = json.loads(value)
        if group:
            registered.queues[(topic, group)] = Queue.from_definition(stored)
        else:
            registered.topics[topic] = int(stored["partitions"])
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        log.warning("skipping unreadable queue definition at offset %d: %s", offset, exc)
