"""Create a queue's topics idempotently and record its definition: the queue topic (its delay
levels when asked for), and per group the markers, redelivery, retry and DLQ topics.

The queue topic, its delay levels and the markers topic have the queue's partition count; the
group's redelivery, retry and dead-letter topics the queue's auxiliary count (at most the
queue's, half of it by default). A message at partition ``p`` of any topic the group reads has
its markers in markers partition ``p``, so one tracker owns it end to end; copies go to
partition ``p mod n`` of an auxiliary topic of ``n`` partitions (``Queue.partition_for``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kmq_dagster.core.naming import validate_topic_name
from kmq_dagster.core.queue import (
    Queue,
    conflicts,
    describe_conflicts,
    topic_configs,
)
from kmq_dagster.core.queue_settings import PARTITIONS, check_settings
from kmq_dagster.errors import ProvisionError, QueueConflictError
from kmq_dagster.kafka.clients import admin_client, kafka_error_of, kafka_error_text
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.provision_plan import (
    BROKER_DEFAULT_REPLICATION,
    Layout,
    PlannedTopic,
    ProvisionPlan,
    aux_topic_names,
    check_partition_counts,
    delay_queue_levels,
    delay_queue_names,
    partition_counts,
    plan_topics,
    queue_topic_names,
)
from kmq_dagster.kafka.registry import load_registry, save_definition, save_topic
from kmq_dagster.settings import KmqSettings

__all__ = [
    "BROKER_DEFAULT_REPLICATION",
    "ProvisionPlan",
    "ProvisionReport",
    "QueueProvisionReport",
    "plan_queue",
    "plan_topic",
    "provision_queue",
    "provision_topic",
    "require_topics",
]


@dataclass
class ProvisionReport:
    """What provisioning found and did, topic by topic."""

    partitions: int
    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Whether the queue's definition was stored anew (first time, or redefined).
    defined: bool = False
    #: The plan that was carried out: every topic with its partitions and settings.
    plan: ProvisionPlan | None = None

    @property
    def changed(self) -> bool:
        return bool(self.created) or self.defined


@dataclass
class QueueProvisionReport(ProvisionReport):
    """What provisioning a queue did, and the queue, opened: its topics are there now."""

    opened: OpenedQueue = field(kw_only=True)


@dataclass(frozen=True)
class _TopicOptions:
    """How new topics are made, as the public functions take it (see :func:`provision_queue`)."""

    replication_factor: int
    min_insync_replicas: int | None
    delay_queue: bool
    delay_levels_ms: Sequence[int] | None


def plan_queue(
    settings: KmqSettings,
    queue: Queue,
    *,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = False,
    delay_levels_ms: Sequence[int] | None = None,
    redefine: bool = False,
) -> ProvisionPlan:
    """What :func:`provision_queue` with the same arguments would do, changing nothing.

    It makes the same checks, so a plan that is returned is one provisioning would carry out.

    Raises:
        QueueConflictError, ProvisionError, KafkaUnavailableError: as :func:`provision_queue`.
    """
    options = _TopicOptions(replication_factor, min_insync_replicas, delay_queue, delay_levels_ms)
    plan, _ = _plan_queue(settings, queue, options, redefine=redefine)
    return plan


def _plan_queue(
    settings: KmqSettings, queue: Queue, options: _TopicOptions, *, redefine: bool
) -> tuple[ProvisionPlan, Queue]:
    """The plan of :func:`plan_queue`, and the definition carrying it out stores."""
    check_settings(queue, (PARTITIONS,))  # a count for new topics: at most MAX_PARTITIONS
    registered = load_registry(settings)
    stored = registered.queues.get((queue.topic, queue.group))
    if stored is not None and not redefine:
        differences = stored.contradictions(**queue.fixed_settings())
        if differences:
            raise QueueConflictError(
                f"queue {queue} is already defined with other settings: {'; '.join(differences)}"
                " (provision again with --redefine, or redefine=True in Python, to change them)"
            )
    _refuse_conflicts(conflicts(queue, registered.queues.values(), registered.topics), queue)
    levels_ms = _delay_levels(settings, queue.topic, options)
    wanted = queue_topic_names(queue, delay_levels_ms=levels_ms)
    layout = _layout(queue.partitions, options, topic_configs(queue, queue.topic, levels_ms))
    # The auxiliary count: as given; else as stored (a queue stored without one has the
    # queue's everywhere); else adopted from existing topics or the default (plan_topics).
    aux_given = queue.aux_partitions
    if aux_given is None and stored is not None:
        aux_given = stored.aux_partitions or stored.partitions
    plan = plan_topics(settings, queue.topic, wanted, layout,
                       aux_topics=aux_topic_names(queue), aux_partitions=aux_given)  # fmt: skip
    defined = _defined(queue, stored, plan)
    stores = stored is None or stored.definition() != defined.definition()
    return replace(plan, group=queue.group, stores_definition=stores), defined


def _defined(queue: Queue, stored: Queue | None, plan: ProvisionPlan) -> Queue:
    """The definition provisioning ``queue`` as ``plan`` says stores (checked again)."""
    aux = queue.aux_partitions
    if aux is None:
        # a definition stored without an auxiliary count keeps having none
        aux = stored.aux_partitions if stored is not None else plan.aux_partitions
    return queue.replace(partitions=plan.partitions, aux_partitions=aux)


def provision_queue(
    settings: KmqSettings,
    queue: Queue,
    *,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = False,
    delay_levels_ms: Sequence[int] | None = None,
    redefine: bool = False,
) -> QueueProvisionReport:
    """Create ``queue``'s topics (existing ones are kept) and store its definition.

    ``queue.partitions`` is the count for new topics; ``None`` adopts the existing queue
    topic's. The delay queue (the level topics ``KmqProducer.send(..., delay=...)`` needs) is
    created only with ``delay_queue=True``, with the levels ``delay_levels_ms`` (default
    :data:`~kmq_dagster.core.delay.DEFAULT_DELAY_LEVELS_MS`); an existing delay queue keeps
    its levels (other levels given are refused) and provisioning without it never deletes it.
    New topics get :func:`~kmq_dagster.core.queue.topic_configs` (dead letters kept for
    ever, retries kept past their delay) and ``min.insync.replicas`` when given; existing
    topics keep theirs. :func:`plan_queue` tells what this would do without doing it.

    Returns:
        What was done, and the queue opened (``report.opened``), ready for the components.

    Raises:
        QueueConflictError: the queue's topics would be shared with another queue, or it is
            defined already with other settings (pass ``redefine=True`` to change them).
        ConfigError: ``delay_levels_ms`` make no ladder, or are given without ``delay_queue``.
        ProvisionError: an existing topic's partition count does not match, the delay queue
            has other levels than ``delay_levels_ms``, or creation failed.
        KafkaUnavailableError: the cluster did not answer.
    """
    options = _TopicOptions(replication_factor, min_insync_replicas, delay_queue, delay_levels_ms)
    plan, defined = _plan_queue(settings, queue, options, redefine=redefine)
    report = _create_topics(settings, plan)
    if plan.stores_definition:
        save_definition(settings, defined)
        report.defined = True
    # Checked: its topics were created (or found) with one partition count, and its definition
    # is the stored one.
    return QueueProvisionReport(**vars(report), opened=vouch_for(settings, defined))


def plan_topic(
    settings: KmqSettings,
    topic: str,
    *,
    partitions: int | None = None,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = False,
    delay_levels_ms: Sequence[int] | None = None,
) -> ProvisionPlan:
    """What :func:`provision_topic` with the same arguments would do, changing nothing.

    Raises:
        QueueConflictError, ProvisionError, KafkaUnavailableError: as :func:`provision_topic`.
    """
    options = _TopicOptions(replication_factor, min_insync_replicas, delay_queue, delay_levels_ms)
    return _plan_topic(settings, topic, partitions, options)


def _plan_topic(
    settings: KmqSettings, topic: str, partitions: int | None, options: _TopicOptions
) -> ProvisionPlan:
    validate_topic_name(topic)
    PARTITIONS.check(partitions)  # new topics: at most MAX_PARTITIONS
    registered = load_registry(settings)
    _refuse_conflicts(conflicts(topic, registered.queues.values()), topic)
    levels_ms = _delay_levels(settings, topic, options)
    wanted = [topic, *delay_queue_names(topic, levels_ms)]
    layout = _layout(partitions, options, topic_configs(None, topic, levels_ms))
    plan = plan_topics(settings, topic, wanted, layout)
    return replace(plan, stores_definition=registered.topics.get(topic) != plan.partitions)


def provision_topic(
    settings: KmqSettings,
    topic: str,
    *,
    partitions: int | None = None,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    min_insync_replicas: int | None = None,
    delay_queue: bool = False,
    delay_levels_ms: Sequence[int] | None = None,
) -> ProvisionReport:
    """Create a queue topic (and, with ``delay_queue=True``, its delay queue with the levels
    ``delay_levels_ms``, as :func:`provision_queue`) without any group's topics.

    Raises:
        QueueConflictError: the topic is another queue's derived topic.
        ProvisionError, KafkaUnavailableError: as :func:`provision_queue`.
    """
    options = _TopicOptions(replication_factor, min_insync_replicas, delay_queue, delay_levels_ms)
    plan = _plan_topic(settings, topic, partitions, options)
    report = _create_topics(settings, plan)
    if plan.stores_definition:
        save_topic(settings, topic, report.partitions)
        report.defined = True
    return report


def require_topics(
    settings: KmqSettings,
    topic: str,
    needed: Sequence[str],
    *,
    fix: str = "",
    aux: Sequence[str] = (),
    aux_partitions: int | None = None,
) -> int:
    """Check ``topic``, ``needed`` and ``aux`` exist, ``needed`` with ``topic``'s partition
    count and ``aux`` with ``aux_partitions`` (``None``: ``topic``'s too); returns ``topic``'s.

    Args:
        fix: the command that creates what is missing, for the error message.

    Raises:
        ProvisionError: a topic is missing or a count differs.
        KafkaUnavailableError: the cluster did not answer.
    """
    wanted = [topic, *needed, *aux]
    existing = partition_counts(settings)
    missing = [name for name in wanted if name not in existing]
    if missing:
        hint = fix or f"kmq provision --topic {topic}"
        raise ProvisionError(f"topics missing: {', '.join(missing)}; run `{hint}` first")
    partitions = existing[topic]
    expected = dict.fromkeys([topic, *needed], partitions)
    expected.update(dict.fromkeys(aux, aux_partitions or partitions))
    check_partition_counts(topic, expected, existing)
    return partitions


def _delay_levels(settings: KmqSettings, topic: str, options: _TopicOptions) -> tuple[int, ...]:
    return delay_queue_levels(
        topic,
        partition_counts(settings),
        delay_queue=options.delay_queue,
        delay_levels_ms=options.delay_levels_ms,
    )


def _layout(
    partitions: int | None, options: _TopicOptions, configs: Mapping[str, Mapping[str, str]]
) -> Layout:
    return Layout(partitions, options.replication_factor, options.min_insync_replicas, configs)


def _refuse_conflicts(clashes: dict[str, list[str]], what: Queue | str) -> None:
    if clashes:
        raise QueueConflictError(
            f"{what} cannot be provisioned: its topic names are taken "
            f"({describe_conflicts(clashes)}); choose another topic or group name"
        )


def _create_topics(settings: KmqSettings, plan: ProvisionPlan) -> ProvisionReport:
    """Carry out ``plan``: create its missing topics (the queue's, then the registry)."""
    report = ProvisionReport(partitions=plan.partitions, plan=plan)
    missing = [planned for planned in plan.topics if not planned.exists]
    report.unchanged = [planned.name for planned in plan.topics if planned.exists]
    admin = admin_client(settings)
    if missing:
        raced = _create(admin, settings, missing)
        report.created = [planned.name for planned in missing if planned.name not in raced]
        report.unchanged += raced
        _wait_until_visible(settings, plan.topic, missing)
    if not plan.registry.exists:
        _create(admin, settings, [plan.registry])
        _wait_until_visible(settings, plan.registry.name, [plan.registry])
    return report


def _create(admin: AdminClient, settings: KmqSettings, new: Sequence[PlannedTopic]) -> list[str]:
    """Create the planned topics; returns those another client created first (checked
    afterwards)."""
    futures = admin.create_topics(
        [
            NewTopic(
                planned.name,
                planned.partitions,
                planned.replication_factor,
                config=dict(planned.config),
            )
            for planned in new
        ],
        request_timeout=settings.request_timeout_ms / 1000,
    )
    raced: list[str] = []
    failures: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            error = kafka_error_of(exc)
            if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                raced.append(name)
            else:
                failures.append(f"{name}: {kafka_error_text(exc)}")
    if failures:
        raise ProvisionError("could not create " + "; ".join(failures))
    return raced


def _wait_until_visible(settings: KmqSettings, topic: str, new: Sequence[PlannedTopic]) -> None:
    """Wait until metadata shows the new topics; check topics another client raced to create."""
    deadline = time.monotonic() + settings.request_timeout_ms / 1000
    names = [planned.name for planned in new]
    while True:
        existing = partition_counts(settings)
        if all(name in existing for name in names):
            expected = {planned.name: planned.partitions for planned in new}
            check_partition_counts(topic, expected, existing)
            return
        if time.monotonic() > deadline:
            absent = [name for name in names if name not in existing]
            raise ProvisionError(f"created topics did not appear in metadata: {absent}")
        time.sleep(0.1)
