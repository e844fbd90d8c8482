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

from kmq_dagster.broker.probe import connection_refused
from kmq_dagster.errors import ConfigError, KafkaAuthError, KafkaUnavailableError
from kmq_dagster.secrets import mask_text
from kmq_dagster.settings import KmqSettings

#: librdkafka's own log lines go here instead of straight to stderr.
CLIENT_LOGGER = logging.getLogger("kmq.kafka.client")
log = logging.getLogger(__name__)
T = TypeVar("T", Producer, Consumer, AdminClient)
#: Seconds a metadata request waits before kmq checks whether any bootstrap broker listens at
#: all (a refused connection is final; a slow broker gets the whole request timeout).
REFUSAL_CHECK_AFTER_S = 2.0

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


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a confluent-kafka exception carries (its first argument), or
    ``None`` if it carries none."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def kafka_error_text(exc: BaseException) -> str:
    """What went wrong in librdkafka's words: the carried ``KafkaError``'s text, else the
    exception's own."""
    error = kafka_error_of(exc)
    return error.str() if error is not None else str(exc)


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
        raise ConfigError(
            f"the Kafka client refused its settings: {mask_text(kafka_error_text(exc))}",
            setting="client_config",
        ) from None


def cluster_metadata(settings: KmqSettings) -> ClusterMetadata:
    """Topic metadata of the whole cluster.

    When the first :data:`REFUSAL_CHECK_AFTER_S` pass without an answer and every bootstrap
    broker refuses a TCP connection, nothing listens there: that is reported at once, instead
    of after the whole request timeout. A broker that accepts but is slow to answer gets the
    whole request timeout.

    Raises:
        KafkaAuthError: the cluster refused the credentials or the TLS handshake.
        KafkaUnavailableError: no broker answered within the request timeout, or every
            bootstrap broker refused the connection.
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
    first_s = min(REFUSAL_CHECK_AFTER_S, timeout_s)
    try:
        return admin.list_topics(timeout=first_s)
    except KafkaException as exc:
        failure = exc
    admin.poll(0)  # serves the queued log lines and error callbacks
    if not problems and not _is_auth_failure(failure):
        if _every_bootstrap_refuses(settings.bootstrap_servers):
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {settings.bootstrap_servers}: the connection was "
                "refused (nothing listens there); is the broker running? Start one with "
                "`kmq broker` or set KMQ_BOOTSTRAP_SERVERS"
            )
        if timeout_s > first_s:
            try:
                return admin.list_topics(timeout=timeout_s - first_s)
            except KafkaException as exc:
                failure = exc
            admin.poll(0)
    raise _metadata_error(settings, failure, problems, timeout_s)


def _is_auth_failure(exc: KafkaException) -> bool:
    error = kafka_error_of(exc)
    return error is not None and error.code() in _AUTH_ERRORS


def _metadata_error(
    settings: KmqSettings, exc: KafkaException, problems: list[str], timeout_s: float
) -> KafkaAuthError | KafkaUnavailableError:
    """The error a failed metadata request is reported as."""
    detail = kafka_error_text(exc)
    if problems or _is_auth_failure(exc):
        reason = problems[0] if problems else detail
        return KafkaAuthError(
            f"Kafka at {settings.bootstrap_servers} refused the connection: "
            f"{mask_text(reason)}; check the security settings (KMQ_KAFKA_SECURITY_PROTOCOL, "
            "KMQ_KAFKA_SASL_*, KMQ_KAFKA_SSL_* or -X)"
        )
    protocol = str(settings.client_config.get("security.protocol", "plaintext"))
    secured = (
        f"; does its listener expect security.protocol={protocol}?"
        if protocol.lower() != "plaintext"
        else ""
    )
    return KafkaUnavailableError(
        f"cannot reach Kafka at {settings.bootstrap_servers} within {timeout_s:g} s "
        f"({mask_text(detail)}); is the broker running{secured}? "
        "Start one with `kmq broker` or set KMQ_BOOTSTRAP_SERVERS"
    )


def bootstrap_addresses(bootstrap_servers: str) -> list[tuple[str, int]] | None:
    """``host:port`` pairs of a bootstrap list (``a:9092,[::1]:9093,SSL://b:9094``); ``None``
    when an entry is not of that form (then nothing is concluded from it)."""
    addresses = []
    for entry in bootstrap_servers.split(","):
        address = entry.strip().rpartition("://")[2]
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            return None
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def _every_bootstrap_refuses(bootstrap_servers: str) -> bool:
    """True if every bootstrap broker refuses a TCP connection right now."""
    addresses = bootstrap_addresses(bootstrap_servers)
    return bool(addresses) and all(connection_refused(host, port) for host, port in addresses or [])


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
