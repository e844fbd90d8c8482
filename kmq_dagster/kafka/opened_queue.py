"""An opened queue: where it lives and its definition, checked once, handed to every component.

A component given an :class:`OpenedQueue` trusts it: opening read the stored definition and
checked the queue's topics, so the consumer, tracker, worker, Spark job, replay and DLQ readers
make no round trip of their own to check it again. A handle comes only from
:func:`~kmq_dagster.kafka.queues.open_queue` (or its siblings) and
:func:`~kmq_dagster.kafka.provision.provision_queue`; building one by hand is refused, so an
unchecked :class:`Queue` cannot pass for a checked one by accident.

Examples:
    >>> opened = open_queue(settings, "orders", "billing")           # doctest: +SKIP
    >>> opened.queue.dlq_topic, opened.partitions                     # doctest: +SKIP
    ('orders.billing.dlq', 8)
    >>> Worker(opened.with_non_retryable(["ValueError"]), handle)     # doctest: +SKIP
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kmq_dagster.core.queue import Queue
from kmq_dagster.settings import KmqSettings

if TYPE_CHECKING:
    from kmq_dagster.schemas.codec import QueueCodecs


class _Proof(enum.Enum):
    """Carried by handles that opening or provisioning built (an enum: it survives pickling,
    so a handle shipped to a Spark executor is still one)."""

    CHECKED = "checked"


@dataclass(frozen=True)
class OpenedQueue:
    """A provisioned queue as it is stored, its topics checked, and the cluster it lives on.

    Attributes:
        settings: how to reach the cluster holding the queue.
        queue: the stored definition, with the partition count read from the cluster and the
            caller's ``non_retryable`` error types in its retry policy.
    """

    settings: KmqSettings
    queue: Queue
    _proof: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._proof is not _Proof.CHECKED:
            raise TypeError(
                "an OpenedQueue comes from open_queue() or provision_queue(), which check the "
                "queue against its stored definition and its topics first"
            )
        if self.queue.partitions is None:
            raise TypeError(f"queue {self.queue} was opened without its partition count")

    def __str__(self) -> str:
        return str(self.queue)

    @property
    def topic(self) -> str:
        """The queue topic."""
        return self.queue.topic

    @property
    def group(self) -> str:
        """The consumer group working the queue."""
        return self.queue.group

    @property
    def partitions(self) -> int:
        """Partitions of the queue topic and its markers topic, as the cluster has them."""
        return self.queue.partitions or 1  # never None: checked in __post_init__

    @property
    def dlq_partitions(self) -> int:
        """Partitions of the group's dead-letter topic (and its redelivery and retry topics)."""
        return self.queue.dlq_partitions

    @property
    def codecs(self) -> QueueCodecs | None:
        """The codecs of the queue's declared value and key formats (``None``: both bytes),
        with the settings' schema registry; one per process."""
        from kmq_dagster.schemas.codec import queue_codecs

        queue = self.queue
        return queue_codecs(
            queue.topic, queue.value_format, queue.key_format, self.settings.schema_registry
        )

    def with_non_retryable(self, names: Iterable[str]) -> OpenedQueue:
        """This queue with ``names`` (exception type names) also sent straight to the DLQ.

        Which errors are fatal is the handler's business, not the stored definition's, so the
        derived handle needs no check: its topics are this one's.
        """
        policy = self.queue.retry_policy.with_non_retryable(names)
        return OpenedQueue(self.settings, self.queue.replace(retry_policy=policy), self._proof)


def vouch_for(settings: KmqSettings, checked: Queue) -> OpenedQueue:
    """The handle of ``checked``; only the functions that checked it call this (opening and
    provisioning, in this package)."""
    return OpenedQueue(settings, checked, _Proof.CHECKED)
