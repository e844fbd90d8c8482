"""Create a queue's topics idempotently: the queue and its delay levels, and per group markers,
redelivery, retry and DLQ topics.

Every topic of a queue has the queue's partition count: a message at partition ``p`` of any of
them has its markers in markers partition ``p``, so one tracker owns it end to end.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kmq_dagster.core.delay import DELAY_LEVELS_MS
from kmq_dagster.core.naming import (
    delay_topics,
    group_topics,
    markers_topic,
    redelivery_topic,
    validate_topic_name,
)
from kmq_dagster.errors import ProvisionError
from kmq_dagster.kafka.clients import admin_client, cluster_metadata
from kmq_dagster.settings import KmqSettings

#: Let the cluster choose (``default.replication.factor``); works on Kafka >= 2.4.
BROKER_DEFAULT_REPLICATION = -1


@dataclass
class ProvisionReport:
    """What provisioning found and did, topic by topic."""

    partitions: int
    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created)


def provision_queue(
    settings: KmqSettings,
    topic: str,
    *,
    partitions: int | None = None,
    group: str | None = None,
    retry_delays_ms: tuple[int, ...] | None = None,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    delay_queue: bool = True,
) -> ProvisionReport:
    """Create the queue topic and, with ``group``, the group's topics; existing ones are kept.

    Args:
        partitions: partition count for new topics; ``None`` adopts the existing queue's.
        retry_delays_ms: one retry topic per distinct delay; default ``settings.retry_delays_ms``.
        delay_queue: also create the delay-level topics that ``send(..., delay=...)`` uses.

    Raises:
        ConfigError: a topic name would be illegal.
        ProvisionError: an existing topic's partition count does not match, or creation failed.
        KafkaUnavailableError: the cluster did not answer.
    """
    validate_topic_name(topic)
    if partitions is not None and partitions < 1:
        raise ProvisionError(f"--partitions must be at least 1, got {partitions}")
    delays_ms = settings.retry_delays_ms if retry_delays_ms is None else retry_delays_ms
    wanted = [
        topic,
        *(delay_topics(topic, DELAY_LEVELS_MS) if delay_queue else []),
        *(group_topics(topic, group, list(delays_ms)) if group else []),
    ]

    admin = admin_client(settings)
    existing = _partition_counts(admin, settings)
    partitions = _resolve_partitions(topic, partitions, existing)
    _check_partition_counts(topic, wanted, partitions, existing)

    report = ProvisionReport(partitions=partitions)
    missing = [name for name in wanted if name not in existing]
    report.unchanged = [name for name in wanted if name in existing]
    if missing:
        raced = _create(admin, settings, missing, partitions, replication_factor)
        report.created = [name for name in missing if name not in raced]
        report.unchanged += raced
        _wait_until_visible(admin, settings, topic, missing, partitions)
    return report


def require_queue_topics(
    settings: KmqSettings, topic: str, group: str, extra: Sequence[str] = ()
) -> int:
    """Check a group's topics of the queue exist with one partition count; returns that count.

    Raises:
        ProvisionError: a topic is missing or the counts differ (with the command that fixes it).
        KafkaUnavailableError: the cluster did not answer.
    """
    needed = [markers_topic(topic, group), redelivery_topic(topic, group), *extra]
    note = " (with the same --retry-delays)" if extra else ""
    return require_topics(settings, topic, needed, options=f" --group {group}", note=note)


def require_topics(
    settings: KmqSettings, topic: str, needed: Sequence[str], *, options: str = "", note: str = ""
) -> int:
    """Check ``topic`` and ``needed`` exist with one partition count; returns that count.

    Raises:
        ProvisionError: a topic is missing or the counts differ (with the command that fixes it).
        KafkaUnavailableError: the cluster did not answer.
    """
    wanted = [topic, *needed]
    existing = _partition_counts(admin_client(settings), settings)
    missing = [name for name in wanted if name not in existing]
    if missing:
        raise ProvisionError(
            f"topics missing: {', '.join(missing)}; "
            f"run `kmq provision --topic {topic}{options}` first{note}"
        )
    _check_partition_counts(topic, wanted, existing[topic], existing)
    return existing[topic]


def _partition_counts(admin: AdminClient, settings: KmqSettings) -> dict[str, int]:
    metadata = cluster_metadata(admin, settings)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


def _resolve_partitions(topic: str, partitions: int | None, existing: dict[str, int]) -> int:
    if topic in existing:
        if partitions is not None and existing[topic] != partitions:
            raise ProvisionError(
                f"topic {topic} exists with {existing[topic]} partitions, not {partitions}; "
                "kmq does not change partition counts (omit --partitions to adopt it)"
            )
        return existing[topic]
    if partitions is None:
        raise ProvisionError(f"topic {topic} does not exist: give --partitions to create it")
    return partitions


def _check_partition_counts(
    topic: str, wanted: list[str], partitions: int, existing: dict[str, int]
) -> None:
    wrong = [
        f"{name} has {existing[name]}"
        for name in wanted
        if name in existing and existing[name] != partitions
    ]
    if wrong:
        raise ProvisionError(
            f"partition counts differ from the queue topic {topic} ({partitions}): "
            f"{', '.join(wrong)}; every topic of a queue needs the same count "
            "(delete and recreate the mismatched topics)"
        )


def _create(
    admin: AdminClient,
    settings: KmqSettings,
    names: list[str],
    partitions: int,
    replication_factor: int,
) -> list[str]:
    """Create topics; returns those another client created first (checked afterwards)."""
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor) for name in names],
        request_timeout=settings.request_timeout_ms / 1000,
    )
    raced: list[str] = []
    failures: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                raced.append(name)
            else:
                failures.append(f"{name}: {error.str()}")
    if failures:
        raise ProvisionError("could not create " + "; ".join(failures))
    return raced


def _wait_until_visible(
    admin: AdminClient, settings: KmqSettings, topic: str, names: list[str], partitions: int
) -> None:
    """Wait until metadata shows the new topics; check topics another client raced to create."""
    deadline = time.monotonic() + settings.request_timeout_ms / 1000
    while True:
        existing = _partition_counts(admin, settings)
        if all(name in existing for name in names):
            _check_partition_counts(topic, names, partitions, existing)
            return
        if time.monotonic() > deadline:
            absent = [name for name in names if name not in existing]
            raise ProvisionError(f"created topics did not appear in metadata: {absent}")
        time.sleep(0.1)
