"""confluent-kafka clients built from :class:`KmqSettings`, with Kafka errors translated.

Every kmq client is made here: a setting librdkafka refuses (``-X bogus.setting=1``) becomes a
:class:`ConfigError` naming it, and a cluster that answers but refuses the credentials or the
TLS handshake is reported as that (:class:`KafkaAuthError`), not as "unreachable".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata

from kmq_dagster.errors import ConfigError, KafkaAuthError, KafkaUnavailableError
from kmq_dagster.secrets import mask_text
from kmq_dagster.settings import KmqSettings

#: librdkafka's own log lines go here instead of straight to stderr.
CLIENT_LOGGER = logging.getLogger("kmq.kafka.client")
log = logging.getLogger(__name__)
T = TypeVar("T", Producer, Consumer, AdminClient)

#: Client error codes that mean "the broker answered but would not let us in".
_AUTH_ERRORS = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
)


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


def new_producer(settings: KmqSettings, **extra: Any) -> Producer:
    """A producer (acks from every in-sync replica; see ``producer_config``) plus ``extra``.

    Raises:
        ConfigError: librdkafka refuses a setting.
    """
    return _built(Producer, settings.producer_config(**{"logger": CLIENT_LOGGER, **extra}))


def new_consumer(settings: KmqSettings, group: str, **extra: Any) -> Consumer:
    """A consumer in ``group`` that never commits on its own.

    Raises:
        ConfigError: librdkafka refuses a setting.
    """
    return _built(Consumer, settings.consumer_config(group, **{"logger": CLIENT_LOGGER, **extra}))


def admin_client(settings: KmqSettings, **extra: Any) -> AdminClient:
    """An ``AdminClient`` for the configured cluster.

    Raises:
        ConfigError: librdkafka refuses a setting.
    """
    return _built(AdminClient, {**settings.admin_config(), "logger": CLIENT_LOGGER, **extra})


def _built(kind: type[T], config: dict[str, Any]) -> T:
    try:
        return kind(config)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        text = error.str() if isinstance(error, KafkaError) else str(error)
        raise ConfigError(
            f"the Kafka client refused its settings: {mask_text(text)}", setting="client_config"
        ) from None


def cluster_metadata(settings: KmqSettings) -> ClusterMetadata:
    """Topic metadata of the whole cluster.

    Raises:
        KafkaAuthError: the cluster refused the credentials or the TLS handshake.
        KafkaUnavailableError: no broker answered within the request timeout.
    """
    timeout_s = settings.request_timeout_ms / 1000
    problems: list[str] = []
    lock = threading.Lock()

    def remember(error: KafkaError) -> None:
        if error.code() in _AUTH_ERRORS:
            with lock:
                problems.append(error.str())

    # Authentication and TLS failures reach us through error_cb or only as client log lines.
    admin = admin_client(settings, error_cb=remember, logger=_FailureLog(problems, lock))
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        admin.poll(0)  # serves the queued log lines and error callbacks
        detail = exc.args[0].str() if exc.args else str(exc)
        if problems or (exc.args and exc.args[0].code() in _AUTH_ERRORS):
            reason = problems[0] if problems else detail
            raise KafkaAuthError(
                f"Kafka at {settings.bootstrap_servers} refused the connection: "
                f"{mask_text(reason)}; check the security settings (KMQ_KAFKA_SECURITY_PROTOCOL, "
                "KMQ_KAFKA_SASL_*, KMQ_KAFKA_SSL_* or -X)"
            ) from None
        protocol = str(settings.client_config.get("security.protocol", "plaintext"))
        secured = (
            f"; does its listener expect security.protocol={protocol}?"
            if protocol.lower() != "plaintext"
            else ""
        )
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers} within {timeout_s:g} s "
            f"({mask_text(detail)}); is the broker running{secured}? "
            "Start one with `kmq broker` or set KMQ_BOOTSTRAP_SERVERS"
        ) from None


class _FailureLog(logging.Logger):
    """librdkafka's log for one metadata request: authentication and TLS failures are kept,
    everything is passed on to :data:`CLIENT_LOGGER`."""

    _MARKERS = ("SASL", "SSL", "authentication", "Authentication", "handshake")

    def __init__(self, failures: list[str], lock: threading.Lock) -> None:
        super().__init__("kmq.kafka.client.metadata")
        self._failures = failures
        self._lock = lock

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        text = str(msg) % args if args else str(msg)
        if level >= logging.ERROR and any(marker in text for marker in self._MARKERS):
            with self._lock:
                if not self._failures:
                    self._failures.append(text.split(": ", 1)[-1])
        CLIENT_LOGGER.log(level, text)


def positions_after(records: Iterable[Message]) -> list[TopicPartition]:
    """Per (topic, partition) of ``records``: the offset after the last one, to commit."""
    after: dict[tuple[str, int], int] = {}
    for record in records:
        source = (record.topic() or "", record.partition() or 0)
        after[source] = max(after.get(source, 0), (record.offset() or 0) + 1)
    return [TopicPartition(topic, p, offset) for (topic, p), offset in sorted(after.items())]
