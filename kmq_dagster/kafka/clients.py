"""confluent-kafka clients built from :class:`KmqSettings`, with Kafka errors translated."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata

from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.settings import KmqSettings

#: librdkafka's own log lines go here instead of straight to stderr.
CLIENT_LOGGER = logging.getLogger("kmq.kafka.client")
log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """Now, in milliseconds since the epoch: the clock every kmq process stamps times with."""
    return time.time_ns() // 1_000_000


@dataclass
class ClientErrors:
    """Kafka client errors counted by name: never swallowed, always logged and counted."""

    total: int = 0
    by_name: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def record(self, error: KafkaError) -> None:
        self.total += 1
        self.by_name[error.name()] += 1

    def on_error(self, error: KafkaError) -> None:
        """An ``error_cb`` for confluent-kafka clients."""
        self.record(error)
        log.warning("Kafka client error: %s", error.str())


def admin_client(settings: KmqSettings) -> AdminClient:
    """An ``AdminClient`` for the configured cluster."""
    config: dict[str, Any] = {**settings.admin_config(), "logger": CLIENT_LOGGER}
    return AdminClient(config)


def cluster_metadata(admin: AdminClient, settings: KmqSettings) -> ClusterMetadata:
    """Topic metadata of the whole cluster.

    Raises:
        KafkaUnavailableError: no broker answered within the request timeout.
    """
    timeout_s = settings.request_timeout_ms / 1000
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers} within {timeout_s:g} s "
            f"({exc.args[0].str() if exc.args else exc}); is the broker running? "
            "Start one with `kmq broker` or set KMQ_BOOTSTRAP_SERVERS"
        ) from exc


def commit_offsets(consumer: Consumer, offsets: list[TopicPartition], *, wait: bool) -> None:
    """Commit ``offsets``; with ``wait``, return once the broker has answered.

    Raises:
        KafkaException: the commit failed (only reported here when waiting).
    """
    if wait:
        consumer.commit(offsets=offsets, asynchronous=False)
    else:
        consumer.commit(offsets=offsets, asynchronous=True)


def positions_after(records: Iterable[Message]) -> list[TopicPartition]:
    """Per (topic, partition) of ``records``: the offset after the last one, to commit."""
    after: dict[tuple[str, int], int] = {}
    for record in records:
        source = (record.topic() or "", record.partition() or 0)
        after[source] = max(after.get(source, 0), (record.offset() or 0) + 1)
    return [TopicPartition(topic, p, offset) for (topic, p), offset in sorted(after.items())]
