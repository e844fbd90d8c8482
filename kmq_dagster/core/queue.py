"""One queue as a value: a topic, the consumer group working it, and how its messages are
redelivered and retried. Every topic name of the queue is derived here, once.

Examples:
    >>> queue = Queue("orders", "billing", partitions=8)
    >>> queue.markers_topic, queue.dlq_topic
    ('orders.billing.markers', 'orders.billing.dlq')
    >>> list(queue.retry_topics.values())
    ['orders.billing.retry.10s', 'orders.billing.retry.1m', 'orders.billing.retry.10m']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.naming import (
    delay_dlq_topic,
    delay_topic,
    dlq_topic,
    markers_topic,
    redelivery_topic,
    retry_topic,
    validate_topic_name,
)
from kmq_dagster.core.queue_settings import QUEUE_SETTINGS, Kind, check_settings
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat, parse_value_format
from kmq_dagster.errors import ConfigError

#: A message not acknowledged within this time is redelivered.
DEFAULT_VISIBILITY_TIMEOUT_MS = 30_000
#: Redeliveries of one message before it goes to the dead-letter topic.
DEFAULT_MAX_REDELIVERIES = 3
#: Delay of each retry after a handler failure (one retry topic per distinct delay).
DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (10_000, 60_000, 600_000)
#: Version of the stored definition format (:meth:`Queue.definition`).
DEFINITION_VERSION = 1


def default_aux_partitions(partitions: int) -> int:
    """Partitions of a new queue's redelivery, retry and dead-letter topics: half the queue's,
    rounded up (8 -> 4, 3 -> 2, 1 -> 1).

    They carry failures only, so half the queue's parallelism serves them; with the markers
    topic (the queue's count) and a 3-step retry policy a queue of 8 partitions holds
    8 + 5 x 4 = 28 auxiliary partitions instead of 48.
    """
    return max(1, -(-partitions // 2))


def default_retry_policy() -> RetryPolicy:
    """Three retries, after 10 s, 1 min and 10 min."""
    return RetryPolicy.fixed(DEFAULT_RETRY_DELAYS_MS)


@dataclass(frozen=True)
class Queue:
    """A queue topic worked by one consumer group, with its redelivery and retry rules.

    Args:
        topic: the queue topic producers write to.
        group: the consumer group; each group gets its own markers, redelivery, retry and
            dead-letter topics, and never sees another group's copies.
        partitions: partition count of every topic of the queue; ``None`` until known (it is
            read from the cluster when the queue is opened).
        retry_policy: when failed messages are retried, and when they go to the DLQ.
        visibility_timeout_ms: an unacknowledged message is redelivered after this long.
        max_redeliveries: redeliveries of one message before it goes to the DLQ.
        value_format: how the values are encoded (``bytes``: kmq never looks inside; ``json``;
            ``avro``, ``protobuf`` or ``json-schema`` in the Schema Registry wire format). Only
            ``message.decoded()`` reads it: what is stored, retried and dead-lettered is always
            the original bytes.
        key_format: the same for the keys (``message.decoded_key()``).
        aux_partitions: partition count of the group's redelivery, retry and dead-letter
            topics; ``None``: the queue's (how queues were provisioned before it existed).
            At most the queue's: a message read from partition ``p`` of a redelivery or retry
            topic has its markers in markers partition ``p``, and the markers topic has the
            queue's count. The markers topic always has the queue's count.

    Raises:
        ConfigError: an illegal name (the derived topic names must be legal Kafka topic names
            too) or an out-of-range value.
    """

    topic: str
    group: str
    partitions: int | None = None
    retry_policy: RetryPolicy = field(default_factory=default_retry_policy)
    visibility_timeout_ms: int = DEFAULT_VISIBILITY_TIMEOUT_MS
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    value_format: ValueFormat = ValueFormat.BYTES
    key_format: ValueFormat = ValueFormat.BYTES
    aux_partitions: int | None = None

    def __post_init__(self) -> None:
        # A name ("avro", "json_schema") is taken too, and checked here.
        for name in ("value_format", "key_format"):
            object.__setattr__(
                self, name, parse_value_format(str(getattr(self, name)), setting=name)
            )
        validate_topic_name(self.topic)
        if not self.group:
            raise ConfigError("the consumer group must not be empty", setting="group")
        for name in self.group_topics:  # also checks the group's characters and the lengths
            validate_topic_name(name)
        # bounds: the one check of each setting (core/queue_settings.py); a queue opened on
        # topics made with Kafka's tools may have more partitions than kmq creates (QueueSpec,
        # YAML and the command line declare new queues and check the upper bounds too)
        check_settings(self, QUEUE_SETTINGS, low_only=("partitions", "aux_partitions"))
        if (
            self.aux_partitions is not None
            and self.partitions is not None
            and self.aux_partitions > self.partitions
        ):
            raise ConfigError(
                f"aux partitions ({self.aux_partitions}) cannot exceed the queue's "
                f"({self.partitions}): a message of partition p of a redelivery or retry "
                "topic has its markers in partition p of the markers topic, which has the "
                "queue's count",
                setting="aux_partitions",
            )

    def __str__(self) -> str:
        return f"{self.topic} / {self.group}"

    # -- derived topic names -------------------------------------------------------------------

    @property
    def markers_topic(self) -> str:
        """Start and end markers of the group's in-flight messages."""
        return markers_topic(self.topic, self.group)

    @property
    def redelivery_topic(self) -> str:
        """Where the tracker re-produces overdue messages, for this group only."""
        return redelivery_topic(self.topic, self.group)

    @property
    def dlq_topic(self) -> str:
        """The group's dead-letter topic."""
        return dlq_topic(self.topic, self.group)

    @property
    def retry_topics(self) -> dict[int, str]:
        """Retry topic per distinct nominal delay (ms), shortest delay first."""
        return {
            delay_ms: retry_topic(self.topic, self.group, delay_ms)
            for delay_ms in self.retry_policy.topic_delays_ms()
        }

    @property
    def first_retry_topic(self) -> str:
        """The retry topic of the first retry."""
        return retry_topic(self.topic, self.group, self.retry_policy.nominal_delay_ms(1))

    @property
    def consumed_topics(self) -> list[str]:
        """What the group's consumers read: the queue, its redeliveries and its retries."""
        return [self.topic, self.redelivery_topic, *self.retry_topics.values()]

    @property
    def group_topics(self) -> list[str]:
        """The topics this queue's group owns, in a stable order."""
        return [
            self.markers_topic,
            self.redelivery_topic,
            *self.retry_topics.values(),
            self.dlq_topic,
        ]

    @property
    def aux_partition_count(self) -> int | None:
        """Partitions of the group's redelivery, retry and dead-letter topics (``None``: not
        known yet): as given, else what provisioning gives a new queue
        (:func:`default_aux_partitions`); an opened queue always has it from its definition."""
        if self.aux_partitions is not None:
            return self.aux_partitions
        return default_aux_partitions(self.partitions) if self.partitions else None

    @property
    def dlq_partitions(self) -> int:
        """Partitions of the dead-letter topic (1 while the queue's count is not known)."""
        return self.aux_partition_count or 1

    def partitions_of(self, name: str) -> int | None:
        """The partition count topic ``name`` of this queue has (``None``: not known yet).

        The queue topic, its markers and its delay queue have the queue's count; the group's
        redelivery, retry and dead-letter topics :attr:`aux_partition_count`.
        """
        if name in (self.redelivery_topic, self.dlq_topic, *self.retry_topics.values()):
            return self.aux_partition_count
        return self.partitions

    def partition_for(self, target: str, source_partition: int) -> int:
        """The partition of ``target`` (a topic of this queue) that a copy of a message read
        from partition ``source_partition`` goes to: the same number, folded into the
        target's count (``p mod n``), so a queue whose topics share one count keeps copies in
        their message's partition."""
        count = self.partitions_of(target)
        return source_partition % count if count else source_partition

    # -- changes and the stored definition -----------------------------------------------------

    def replace(self, **changes: Any) -> Queue:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def definition(self) -> dict[str, Any]:
        """What is stored when the queue is provisioned (JSON-compatible).

        ``retry_policy.non_retryable`` is left out: which errors are fatal is the handler's
        business, not the queue's.
        """
        return {
            "version": DEFINITION_VERSION,
            "topic": self.topic,
            "group": self.group,
            "partitions": self.partitions,
            "visibility_timeout_ms": self.visibility_timeout_ms,
            "max_redeliveries": self.max_redeliveries,
            "retry": policy_definition(self.retry_policy),
            "value_format": self.value_format.value,
            "key_format": self.key_format.value,
            # written only when set: a queue provisioned before it existed keeps its definition
            **({} if self.aux_partitions is None else {"aux_partitions": self.aux_partitions}),
        }

    @classmethod
    def from_definition(cls, stored: Mapping[str, Any]) -> Queue:
        """The queue a :meth:`definition` describes.

        Raises:
            ConfigError: not a definition this version understands.
        """
        try:
            if stored["version"] != DEFINITION_VERSION:
                raise ConfigError(f"unknown queue definition version {stored['version']!r}")
            return cls(
                topic=str(stored["topic"]),
                group=str(stored["group"]),
                partitions=stored["partitions"],
                retry_policy=policy_from_definition(stored["retry"]),
                visibility_timeout_ms=int(stored["visibility_timeout_ms"]),
                max_redeliveries=int(stored["max_redeliveries"]),
                # Definitions stored before formats existed have none: their values are bytes.
                value_format=parse_value_format(str(stored.get("value_format", "bytes"))),
                key_format=parse_value_format(str(stored.get("key_format", "bytes"))),
                # Definitions stored before it existed have none: every topic has the queue's.
                aux_partitions=stored.get("aux_partitions", stored["partitions"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"unreadable queue definition ({exc!r})") from None

    def fixed_settings(self) -> dict[str, Any]:
        """The settings provisioning fixes, by name: what :meth:`contradictions` and
        ``open_queue`` take besides the partition count (which is the cluster's to say)."""
        return {
            setting.name: getattr(self, setting.name)
            for setting in QUEUE_SETTINGS
            if setting.name not in _NOT_FIXED
        }

    def contradictions(self, **given: Any) -> list[str]:
        """How the given settings (by name, e.g. ``visibility_timeout_ms``; ``None``: not
        given) contradict this queue, one phrase each, e.g. ``visibility timeout 30s (given:
        10m)``.

        The retry policies are compared as stored, so ``non_retryable`` never contradicts; a
        partition count contradicts only a known one.

        Raises:
            TypeError: a name that is no setting of a queue.
        """
        unknown = set(given) - {setting.name for setting in QUEUE_SETTINGS}
        if unknown:
            raise TypeError(f"no such queue settings: {sorted(unknown)}")
        found = []
        for setting in QUEUE_SETTINGS:
            value, mine = given.get(setting.name), getattr(self, setting.name)
            if value is None or mine is None:
                continue
            if isinstance(mine, RetryPolicy):
                if policy_definition(value) != policy_definition(mine):
                    found.append(f"{mine.describe()} (given: {value.describe()})")
            elif value != mine:
                shown = format_duration_ms if setting.kind is Kind.DURATION else str
                words = setting.name.removesuffix("_ms").replace("_", " ")
                found.append(f"{words} {shown(mine)} (given: {shown(value)})")
        return found


#: Settings of a queue that are not fixed by its definition: its name, and the partition counts
#: the cluster's topics have.
_NOT_FIXED = frozenset({"topic", "group", "partitions", "aux_partitions"})


def policy_definition(policy: RetryPolicy) -> dict[str, Any]:
    """A retry policy as stored in a queue definition (without ``non_retryable``)."""
    if policy.delays_ms:
        return {"delays_ms": list(policy.delays_ms), "jitter": policy.jitter}
    return {
        "initial_delay_ms": policy.initial_delay_ms,
        "multiplier": policy.multiplier,
        "max_delay_ms": policy.max_delay_ms,
        "max_attempts": policy.max_attempts,
        "jitter": policy.jitter,
    }


def policy_from_definition(stored: Mapping[str, Any]) -> RetryPolicy:
    """The retry policy :func:`policy_definition` describes."""
    if "delays_ms" in stored:
        return RetryPolicy(
            delays_ms=tuple(int(d) for d in stored["delays_ms"]), jitter=float(stored["jitter"])
        )
    return RetryPolicy(
        initial_delay_ms=int(stored["initial_delay_ms"]),
        multiplier=float(stored["multiplier"]),
        max_delay_ms=int(stored["max_delay_ms"]),
        max_attempts=int(stored["max_attempts"]),
        jitter=float(stored["jitter"]),
    )


def topic_family(topic: str) -> set[str]:
    """The topics every group of ``topic`` shares that another queue's names could take: the
    queue topic and its delay DLQ.

    Its delay-level topics ``<topic>.delay.<duration>`` (whatever levels were chosen) are no
    other queue's group topic: those end in ``markers``, ``redelivery``, ``dlq`` or
    ``retry.<duration>``, never in ``delay.<duration>``.
    """
    return {topic, delay_dlq_topic(topic)}


def conflicts(
    candidate: Queue | str, queues: Iterable[Queue], topics: Iterable[str] = ()
) -> dict[str, list[str]]:
    """Topics ``candidate`` (a queue, or a bare queue topic) would share with other queues.

    Names are built by joining topic and group with dots, so ``ca.b`` with group ``c`` and
    ``ca`` with group ``b.c`` derive the same topics: the second must be refused. Two groups of
    one topic share only the topic and its delay queue, which is intended.

    Args:
        queues: the defined queues; the candidate's own definition among them is ignored.
        topics: queue topics provisioned without a group.

    Returns:
        The shared topic names by the queue that owns them ("orders / billing"), empty if none.
    """
    own = (candidate.topic, candidate.group) if isinstance(candidate, Queue) else None
    mine = set(candidate.group_topics) if isinstance(candidate, Queue) else set()
    family = topic_family(candidate.topic if isinstance(candidate, Queue) else candidate)
    found: dict[str, list[str]] = {}
    for other in queues:
        if (other.topic, other.group) == own:
            continue
        theirs = set(other.group_topics)
        clash = (mine & (theirs | topic_family(other.topic))) | (family & theirs)
        if clash:
            found[f"queue {other}"] = sorted(clash)
    for topic in topics:
        if clash := mine & topic_family(topic):
            found[f"queue topic {topic}"] = sorted(clash)
    return found


def describe_conflicts(found: Mapping[str, list[str]]) -> str:
    """``found`` (from :func:`conflicts`) in one line."""
    parts = []
    for owner, names in found.items():
        shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
        parts.append(f"{shown} of {owner}")
    return "; ".join(parts)


#: Kafka's default retention, a week: the least kmq gives a retry topic.
MIN_RETRY_RETENTION_MS = 7 * 86_400_000
#: ``retention.ms`` of "keep for ever".
KEEP_FOREVER = "-1"


def topic_configs(
    queue: Queue | None, topic: str, delay_levels_ms: Iterable[int] = ()
) -> dict[str, dict[str, str]]:
    """The settings kmq creates its topics with, by topic name (others: the cluster's defaults).

    Dead-letter topics keep every record for ever: retention deleting a dead letter would lose
    a message. A retry topic, and a delay-level topic of ``delay_levels_ms``, keeps a copy at
    least twice its delay (and a week), so nothing is deleted before it is due to leave.
    """
    configs: dict[str, dict[str, str]] = {delay_dlq_topic(topic): {"retention.ms": KEEP_FOREVER}}
    for level_ms in delay_levels_ms:
        retention_ms = max(MIN_RETRY_RETENTION_MS, 2 * level_ms)
        configs[delay_topic(topic, level_ms)] = {"retention.ms": str(retention_ms)}
    if queue is not None:
        configs[queue.dlq_topic] = {"retention.ms": KEEP_FOREVER}
        for delay_ms, name in queue.retry_topics.items():
            retention_ms = max(MIN_RETRY_RETENTION_MS, 2 * delay_ms)
            configs[name] = {"retention.ms": str(retention_ms)}
    return configs
