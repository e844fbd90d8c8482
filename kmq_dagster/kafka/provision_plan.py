"""What provisioning would create, read from the cluster without changing it.

Provisioning is two steps: :func:`plan_topics` reads the cluster's topics and decides, topic by
topic, what exists and what would be created with which partitions, replicas and settings; then
:mod:`kmq_dagster.kafka.provision` creates exactly the plan's missing topics. ``kmq provision
--plan`` stops after the first step, so what it prints is what a run would do.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kmq_dagster.core.delay import ladder_to_provision
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.naming import delay_levels_of
from kmq_dagster.core.naming import delay_topics as delay_topics_of
from kmq_dagster.core.queue import Queue, default_aux_partitions
from kmq_dagster.core.wording import counted
from kmq_dagster.errors import ConfigError, ProvisionError
from kmq_dagster.kafka.clients import cluster_metadata
from kmq_dagster.kafka.registry import REGISTRY_TOPIC_CONFIG
from kmq_dagster.settings import KmqSettings

#: Let the cluster choose (``default.replication.factor``); works on Kafka >= 2.4.
BROKER_DEFAULT_REPLICATION = -1


@dataclass(frozen=True)
class Layout:
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


@dataclass(frozen=True)
class PlannedTopic:
    """One topic of a plan: created with these values, unless it exists already."""

    name: str
    partitions: int
    #: Replicas per partition; :data:`BROKER_DEFAULT_REPLICATION` lets the cluster decide.
    replication_factor: int
    #: Settings kmq sets on creation; the cluster's defaults apply to the rest.
    config: Mapping[str, str]
    #: The partitions of the existing topic; ``None``: the topic would be created.
    existing_partitions: int | None = None

    @property
    def exists(self) -> bool:
        return self.existing_partitions is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.name,
            "exists": self.exists,
            "partitions": self.existing_partitions if self.exists else self.partitions,
            "replication_factor": None if self.exists else self.replication_factor,
            "config": None if self.exists else dict(self.config),
        }


@dataclass(frozen=True)
class ProvisionPlan:
    """Every topic provisioning a queue (or a bare queue topic) creates or finds.

    ``topics`` are the queue's own, in creation order; ``registry`` is the definitions topic
    every queue shares (created once per cluster).
    """

    topic: str
    group: str | None
    partitions: int
    topics: tuple[PlannedTopic, ...]
    registry: PlannedTopic
    #: Whether the queue's definition would be stored (new, or changed).
    stores_definition: bool = False
    #: Partitions of the group's redelivery, retry and dead-letter topics (``None``: no group).
    aux_partitions: int | None = None

    @property
    def all_topics(self) -> tuple[PlannedTopic, ...]:
        return (*self.topics, self.registry)

    @property
    def to_create(self) -> list[PlannedTopic]:
        return [planned for planned in self.all_topics if not planned.exists]

    @property
    def created_partitions(self) -> int:
        """Partitions the topics to create would add to the cluster."""
        return sum(planned.partitions for planned in self.to_create)

    @property
    def queue_partitions(self) -> int:
        """Partitions of the queue's own topics once provisioned (the registry not counted)."""
        return sum(planned.existing_partitions or planned.partitions for planned in self.topics)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "group": self.group,
            "partitions": self.partitions,
            "aux_partitions": self.aux_partitions,
            "topics": [planned.as_dict() for planned in self.all_topics],
            "create_topics": len(self.to_create),
            "create_partitions": self.created_partitions,
            "queue_topics": len(self.topics),
            "queue_partitions": self.queue_partitions,
            "stores_definition": self.stores_definition,
        }


def describe_plan(plan: ProvisionPlan) -> list[str]:
    """``plan`` for a person: a heading, one line per topic, the totals."""
    queue = plan.topic if plan.group is None else f"{plan.topic}, group {plan.group}"
    counts = counted(plan.partitions, "partition")
    if plan.aux_partitions is not None:
        counts += f"; redelivery, retry and DLQ topics {plan.aux_partitions}"
    lines = [f"plan for queue {queue} ({counts}); nothing created"]
    rows = [
        (
            ("keep", planned.name, f"exists, {counted(planned.existing_partitions, 'partition')}")
            if planned.existing_partitions is not None
            else (
                "create",
                planned.name,
                counted(planned.partitions, "partition"),
                f"replication {describe_replication(planned.replication_factor)}",
                describe_config(planned.config),
            )
        )
        for planned in plan.all_topics
    ]
    # an existing topic's one cell past its name does not widen the columns of new ones
    widths = [max((len(r[i]) for r in rows if len(r) == 5 or i < 2), default=0) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  " + "  ".join(cells).rstrip())
    created = plan.to_create
    lines.append(
        f"would create {counted(len(created), 'topic')} with "
        f"{counted(plan.created_partitions, 'partition')}; the queue's "
        f"{counted(len(plan.topics), 'topic')} hold {counted(plan.queue_partitions, 'partition')}"
    )
    if plan.stores_definition:
        lines.append("would store the queue's definition in " + plan.registry.name)
    return lines


def describe_config(config: Mapping[str, str]) -> str:
    """Settings of a new topic in words: ``retention forever, min.insync.replicas=2``."""
    if not config:
        return "cluster defaults"
    parts = []
    for key, value in config.items():
        if key == "retention.ms":
            kept = "forever" if int(value) < 0 else format_duration_ms(int(value))
            parts.append(f"retention {kept}")
        elif key == "cleanup.policy":
            parts.append(f"cleanup {value}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def describe_replication(replication_factor: int) -> str:
    if replication_factor == BROKER_DEFAULT_REPLICATION:
        return "cluster default"
    return str(replication_factor)


def plan_topics(
    settings: KmqSettings,
    topic: str,
    wanted: Sequence[str],
    layout: Layout,
    *,
    aux_topics: Sequence[str] = (),
    aux_partitions: int | None = None,
) -> ProvisionPlan:
    """Read the cluster's topics and decide what provisioning ``wanted`` would create.

    Args:
        aux_topics: those of ``wanted`` that get ``aux_partitions`` partitions (the group's
            redelivery, retry and dead-letter topics); the others get the queue topic's.
        aux_partitions: ``None``: adopt the count of an existing one of ``aux_topics``, else
            :func:`~kmq_dagster.core.queue.default_aux_partitions` of the queue's.

    Raises:
        ProvisionError: a partition count does not match what the topic needs, or the queue
            topic is new and no partition count was given.
        KafkaUnavailableError: the cluster did not answer.
    """
    existing = partition_counts(settings)
    partitions = _resolve_partitions(topic, layout.partitions, existing)
    aux_count = None
    if aux_topics:
        found = [existing[name] for name in aux_topics if name in existing]
        aux_count = aux_partitions or (found[0] if found else default_aux_partitions(partitions))
    aux = set(aux_topics)
    expected = {name: aux_count if name in aux and aux_count else partitions for name in wanted}
    check_partition_counts(topic, expected, existing)
    planned = tuple(
        PlannedTopic(
            name,
            expected[name],
            layout.replication_factor,
            layout.config_of(name),
            existing.get(name),
        )
        for name in wanted
    )
    registry = PlannedTopic(
        settings.registry_topic,
        1,
        layout.replication_factor,
        {**layout.config_of(""), **REGISTRY_TOPIC_CONFIG},
        existing.get(settings.registry_topic),
    )
    return ProvisionPlan(topic, None, partitions, planned, registry, aux_partitions=aux_count)


def queue_topic_names(queue: Queue, *, delay_levels_ms: Sequence[int] = ()) -> list[str]:
    """The topics provisioning ``queue`` creates, in creation order (the registry aside), with
    its delay queue's level topics and DLQ when it has levels ``delay_levels_ms``."""
    return [queue.topic, *delay_queue_names(queue.topic, delay_levels_ms), *queue.group_topics]


def delay_queue_names(topic: str, delay_levels_ms: Sequence[int]) -> list[str]:
    """The delay queue's topics of ``topic`` with the levels ``delay_levels_ms`` (none: no
    delay queue, no topics)."""
    return delay_topics_of(topic, delay_levels_ms) if delay_levels_ms else []


def delay_queue_levels(
    topic: str,
    existing: Collection[str],
    *,
    delay_queue: bool,
    delay_levels_ms: Sequence[int] | None,
) -> tuple[int, ...]:
    """The levels of the delay queue provisioning ``topic`` creates or keeps (none without
    ``delay_queue``): the existing ladder's, else ``delay_levels_ms``, else the default ones.

    Raises:
        ConfigError: levels given without ``delay_queue``, or levels that make no ladder.
        ProvisionError: the topic has a ladder of other levels (it is never changed in place).
    """
    if not delay_queue:
        if delay_levels_ms is not None:
            raise ConfigError(
                "delay levels go with the delay queue: add --delays (delay_queue=True)",
                setting="delay_levels",
            )
        return ()
    return ladder_to_provision(topic, existing, delay_levels_ms)


def aux_topic_names(queue: Queue) -> list[str]:
    """The group's topics that take the queue's auxiliary partition count: all but markers.

    The markers topic keeps the queue's count: a message read from partition ``p`` of any
    topic the group consumes has its start and end markers in markers partition ``p``, which
    one tracker owns, so the markers topic needs at least as many partitions as the topics
    the group reads, the queue topic among them.
    """
    return [name for name in queue.group_topics if name != queue.markers_topic]


@dataclass(frozen=True)
class QueueFootprint:
    """What a provisioned queue and group hold on the cluster."""

    #: The queue's topics that exist and are counted here (the queue topic and its delay queue
    #: unless ``shared`` is false, the group's topics).
    topics: tuple[str, ...]
    #: Their partitions, all together.
    partitions: int
    #: Whether the topics every group of the queue shares (the queue topic, its delay queue)
    #: are counted here; false on a further group's footprint, which counts only its own.
    shared: bool = True


def queue_footprint(
    queue: Queue, existing: Mapping[str, int], *, shared: bool = True
) -> QueueFootprint:
    """The topics of ``queue`` found in ``existing`` (from :func:`partition_counts`); without
    ``shared``, only the group's own (the queue topic and delay queue counted elsewhere)."""
    # a delay queue counts where it was created (it is opt-in), with the levels it has
    names = (
        queue_topic_names(queue, delay_levels_ms=delay_levels_of(queue.topic, existing))
        if shared
        else queue.group_topics
    )
    found = tuple(name for name in names if name in existing)
    return QueueFootprint(found, sum(existing[name] for name in found), shared)


def queue_footprints(queues: Sequence[Queue], existing: Mapping[str, int]) -> list[QueueFootprint]:
    """The footprint of each of ``queues``, counting the topics the groups of one queue share
    once: on the first of its groups, so that the footprints add up to what the queues hold."""
    counted_topics: set[str] = set()
    footprints = []
    for queue in queues:
        footprints.append(
            queue_footprint(queue, existing, shared=queue.topic not in counted_topics)
        )
        counted_topics.add(queue.topic)
    return footprints


def partition_counts(settings: KmqSettings) -> dict[str, int]:
    """Every topic of the cluster with its partition count."""
    metadata = cluster_metadata(settings)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


def _resolve_partitions(topic: str, partitions: int | None, existing: Mapping[str, int]) -> int:
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


def check_partition_counts(
    topic: str, expected: Mapping[str, int], existing: Mapping[str, int]
) -> None:
    """Refuse a queue whose existing topics have another partition count than ``expected``
    (by topic name).

    Raises:
        ProvisionError: naming each mismatched topic.
    """
    wrong = [
        f"{name} has {existing[name]}, needs {count}"
        for name, count in expected.items()
        if name in existing and existing[name] != count
    ]
    if wrong:
        raise ProvisionError(
            f"partition counts differ from the queue's (queue topic {topic}): "
            f"{', '.join(wrong)}; kmq does not change partition counts "
            "(delete and recreate the mismatched topics)"
        )
