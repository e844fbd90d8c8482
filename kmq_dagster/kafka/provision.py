"""Create a queue's topics idempotently and record its definition: the queue topic and its delay
levels, and per group the markers, redelivery, retry and DLQ topics.

Every topic of a queue has the queue's partition count: a message at partition ``p`` of any of
them has its markers in markers partition ``p``, so one tracker owns it end to end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kmq_dagster.core.naming import validate_topic_name
from kmq_dagster.core.queue import (
    Queue,
    conflicts,
    describe_conflicts,
    topic_configs,
    topic_family,
)
from kmq_dagster.errors import ConfigError, ProvisionError, QueueConflictError
from kmq_dagster.kafka.clients import admin_client, cluster_metadata
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.registry import (
    REGISTRY_TOPIC_CONFIG,
    load_registry,
    save_definition,
    save_topic,
)
from kmq_dagster.settings import KmqSettings

#: Let the cluster choose (``default.replication.factor``); works on Kafka >= 2.4.
BROKER_DEFAULT_REPLICATION = -1


@dataclass
class ProvisionReport:
    """What provisioning found and did, topic by topic."""

    partitions: int
    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Whether the queue's definition was stored anew (first time, or redefined).
    defined: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.created) or self.defined


@dataclass
class QueueProvisionReport(ProvisionReport):
    """What provisioning a queue did, and the queue, opened: its topics are there now."""

    opened: OpenedQueue = field(kw_only=True)


def provision_queue(
    settings: KmqSettings,
    queue: Queue,
    *,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = True,
    redefine: bool = False,
) -> QueueProvisionReport:
    """Create ``queue``'s topics (existing ones are kept) and store its definition.

    ``queue.partitions`` is the count for new topics; ``None`` adopts the existing queue
    topic's. New topics get :func:`~kmq_dagster.core.queue.topic_configs` (dead letters kept for
    ever, retries kept past their delay) and ``min.insync.replicas`` when given; existing topics
    keep theirs.

    Returns:
        What was done, and the queue opened (``report.opened``), ready for the components.

    Raises:
        QueueConflictError: the queue's topics would be shared with another queue, or it is
            defined already with other settings (pass ``redefine=True`` to change them).
        ProvisionError: an existing topic's partition count does not match, or creation failed.
        KafkaUnavailableError: the cluster did not answer.
    """
    registered = load_registry(settings)
    stored = registered.queues.get((queue.topic, queue.group))
    if stored is not None and not redefine:
        differences = stored.contradictions(
            retry_policy=queue.retry_policy,
            visibility_timeout_ms=queue.visibility_timeout_ms,
            max_redeliveries=queue.max_redeliveries,
            value_format=queue.value_format,
            key_format=queue.key_format,
        )
        if differences:
            raise QueueConflictError(
                f"queue {queue} is already defined with other settings: {'; '.join(differences)}"
                " (provision again with --redefine, or redefine=True in Python, to change them)"
            )
    _refuse_conflicts(conflicts(queue, registered.queues.values(), registered.topics), queue)
    wanted = [queue.topic, *(queue.delay_topics if delay_queue else []), *queue.group_topics]
    layout = _Layout(queue.partitions, replication_factor, min_insync_replicas,
                     topic_configs(queue, queue.topic))  # fmt: skip
    report = _create_topics(settings, queue.topic, wanted, layout)
    defined = queue.replace(partitions=report.partitions)
    if stored is None or stored.definition() != defined.definition():
        save_definition(settings, defined)
        report.defined = True
    # Checked: its topics were created (or found) with one partition count, and its definition
    # is the stored one.
    return QueueProvisionReport(**vars(report), opened=vouch_for(settings, defined))


def provision_topic(
    settings: KmqSettings,
    topic: str,
    *,
    partitions: int | None = None,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = True,
) -> ProvisionReport:
    """Create a queue topic (and its delay queue) without any group's topics.

    Raises:
        QueueConflictError: the topic is another queue's derived topic.
        ProvisionError, KafkaUnavailableError: as :func:`provision_queue`.
    """
    validate_topic_name(topic)
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions must be at least 1, got {partitions}", setting="partitions")
    registered = load_registry(settings)
    _refuse_conflicts(conflicts(topic, registered.queues.values()), topic)
    wanted = sorted(topic_family(topic)) if delay_queue else [topic]
    layout = _Layout(partitions, replication_factor, min_insync_replicas,
                     topic_configs(None, topic))  # fmt: skip
    report = _create_topics(settings, topic, wanted, layout)
    if registered.topics.get(topic) != report.partitions:
        save_topic(settings, topic, report.partitions)
        report.defined = True
    return report


def require_topics(
    settings: KmqSettings, topic: str, needed: Sequence[str], *, fix: str = ""
) -> int:
    """Check ``topic`` and ``needed`` exist with one partition count; returns that count.

    Args:
        fix: the command that creates what is missing, for the error message.

    Raises:
        ProvisionError: a topic is missing or the counts differ.
        KafkaUnavailableError: the cluster did not answer.
    """
    wanted = [topic, *needed]
    existing = _partition_counts(settings)
    missing = [name for name in wanted if name not in existing]
    if missing:
        hint = fix or f"kmq provision --topic {topic}"
        raise ProvisionError(f"topics missing: {', '.join(missing)}; run `{hint}` first")
    _check_partition_counts(topic, wanted, existing[topic], existing)
    return existing[topic]


def _refuse_conflicts(clashes: dict[str, list[str]], what: Queue | str) -> None:
    if clashes:
        raise QueueConflictError(
            f"{what} cannot be provisioned: its topic names are taken "
            f"({describe_conflicts(clashes)}); choose another topic or group name"
        )


@dataclass(frozen=True)
class _Layout:
    """How new topics are created: partitions, replicas, and settings per topic."""

    partitions: int | None
    replication_factor: int
    min_insync_replicas: int | None
    configs: Mapping[str, Mapping[str, str]]

    def config_of(self, name: str) -> dict[str, str]:
        config = dict(self.configs.get(name, {}))
        if self.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_replicas)
        return config


def _create_topics(
    settings: KmqSettings, topic: str, wanted: list[str], layout: _Layout
) -> ProvisionReport:
    existing = _partition_counts(settings)
    partitions = _resolve_partitions(topic, layout.partitions, existing)
    _check_partition_counts(topic, wanted, partitions, existing)
    report = ProvisionReport(partitions=partitions)
    missing = [name for name in wanted if name not in existing]
    report.unchanged = [name for name in wanted if name in existing]
    admin = admin_client(settings)
    if missing:
        new = {name: (partitions, layout.config_of(name)) for name in missing}
        raced = _create(admin, settings, new, layout.replication_factor)
        report.created = [name for name in missing if name not in raced]
        report.unchanged += raced
        _wait_until_visible(settings, topic, missing, partitions)
    if settings.registry_topic not in existing:
        registry = {settings.registry_topic: (1, {**layout.config_of(""), **REGISTRY_TOPIC_CONFIG})}
        _create(admin, settings, registry, layout.replication_factor)
        _wait_until_visible(settings, settings.registry_topic, [settings.registry_topic], 1)
    return report


def _partition_counts(settings: KmqSettings) -> dict[str, int]:
    metadata = cluster_metadata(settings)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


def _resolve_partitions(topic: str, partitions: int | None, existing: dict[str, int]) -> int:
    if topic in existing:
        if partitions is not None and existing[topic] != partitions:
            raise ProvisionError(
                f"topic {topic} exists with {existing[topic]} partitions, not {partitions}; "
                "kmq does not change partition counts (omit the partition count to adopt it)"
            )
        return existing[topic]
    if partitions is None:
        raise ProvisionError(f"topic {topic} does not exist: give a partition count to create it")
    return partitions


def _check_partition_counts(
    topic: str, wanted: list[str], partitions: int, existing: Mapping[str, int]
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
    new: Mapping[str, tuple[int, dict[str, str]]],
    replication_factor: int,
) -> list[str]:
    """Create topics (name -> partitions, settings); returns those another client created
    first (checked afterwards)."""
    futures = admin.create_topics(
        [
            NewTopic(name, count, replication_factor, config=config)
            for name, (count, config) in new.items()
        ],
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
    settings: KmqSettings, topic: str, names: list[str], partitions: int
) -> None:
    """Wait until metadata shows the new topics; check topics another client raced to create."""
    deadline = time.monotonic() + settings.request_timeout_ms / 1000
    while True:
        existing = _partition_counts(settings)
        if all(name in existing for name in names):
            _check_partition_counts(topic, names, partitions, existing)
            return
        if time.monotonic() > deadline:
            absent = [name for name in names if name not in existing]
            raise ProvisionError(f"created topics did not appear in metadata: {absent}")
        time.sleep(0.1)
