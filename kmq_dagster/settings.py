"""One settings object for every kmq process: environment ``KMQ_*`` first, then flags.

Examples:
    >>> settings = KmqSettings.from_env({"KMQ_BOOTSTRAP_SERVERS": "kafka-1:9092"})
    >>> settings.admin_config()["bootstrap.servers"]
    'kafka-1:9092'

Client security settings are passed to confluent-kafka untouched: ``KMQ_KAFKA_SASL_MECHANISM=PLAIN``
becomes ``sasl.mechanism=PLAIN`` (drop the prefix, lower-case, ``_`` -> ``.``), and so does the
CLI flag ``-X sasl.mechanism=PLAIN``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.durations import parse_duration_ms
from kmq_dagster.core.queue import (
    DEFAULT_MAX_REDELIVERIES,
    DEFAULT_RETRY_DELAYS_MS,
    DEFAULT_VISIBILITY_TIMEOUT_MS,
    Queue,
)
from kmq_dagster.core.queue_settings import QUEUE_SETTINGS, check_settings
from kmq_dagster.core.retry import RetryPolicy, parse_delay_list
from kmq_dagster.errors import ConfigError
from kmq_dagster.schemas.registry import RegistrySettings
from kmq_dagster.secrets import mask_config, register_config_secrets, register_secret

#: Port the embedded broker listens on unless told otherwise.
DEFAULT_BROKER_PORT = 9092
#: Where every command looks for Kafka unless told otherwise: the embedded broker.
DEFAULT_BOOTSTRAP_SERVERS = f"127.0.0.1:{DEFAULT_BROKER_PORT}"
#: Apache Kafka rejects session timeouts below 6 s by default; joins take ~timeout/2 on Tansu.
DEFAULT_SESSION_TIMEOUT_MS = 10_000
#: How long admin calls and metadata requests may take before "Kafka unreachable".
DEFAULT_REQUEST_TIMEOUT_MS = 15_000
#: Longest a fetch waits for data. Apache Kafka answers as soon as data arrives, so this only
#: trims idle traffic there; brokers that hold a fetch for the full wait (the embedded one)
#: add up to this much latency.
DEFAULT_FETCH_WAIT_MAX_MS = 50
#: How soon a consumer fetches again after its local queue was full (librdkafka: 1000 ms).
FETCH_QUEUE_BACKOFF_MS = 10
#: Client-side size limit of kmq's producers unless ``-X message.max.bytes`` sets another: the
#: broker's own limit is the one that usually counts. A record over either limit that kmq must
#: copy (redeliver, retry, dead-letter) is dead-lettered as a reference (``core.oversize``).
PRODUCER_MESSAGE_MAX_BYTES = 16 * 1024 * 1024
#: The largest ``message.max.bytes`` librdkafka takes (``-X message.max.bytes`` up to it).
MAX_PRODUCER_MESSAGE_MAX_BYTES = 1_000_000_000
#: Messages fetched per batch; one start marker covers a contiguous run of a batch.
DEFAULT_BATCH_SIZE = 500
#: Largest batch: librdkafka's consume() takes at most this many messages at once.
MAX_BATCH_SIZE = 1_000_000
#: Where queue definitions are stored when queues are provisioned (one partition).
DEFAULT_REGISTRY_TOPIC = "_kmq_queues"

_CLIENT_PREFIX = "KMQ_KAFKA_"
#: What a confluent-kafka setting's name looks like (``sasl.password``, ``ssl.key.pem``).
_SETTING_NAME = re.compile(r"[A-Za-z0-9_.-]+")

__all__ = ["KmqSettings", "parse_client_options", "parse_delay_list"]


@dataclass(frozen=True)
class KmqSettings:
    """Connection and queue settings shared by every kmq command and resource.

    ``visibility_timeout_ms``, ``max_redeliveries`` and ``retry_delays_ms`` are the defaults
    of a queue being provisioned (:meth:`define_queue`); an opened queue has its stored ones.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVERS
    client_id: str = "kmq"
    #: Extra confluent-kafka settings (security: ``security.protocol``, ``sasl.*``, ``ssl.*``).
    client_config: Mapping[str, str] = field(default_factory=dict)
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    fetch_wait_max_ms: int = DEFAULT_FETCH_WAIT_MAX_MS
    visibility_timeout_ms: int = DEFAULT_VISIBILITY_TIMEOUT_MS
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    batch_size: int = DEFAULT_BATCH_SIZE
    retry_delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS
    #: Topic holding the definitions of provisioned queues.
    registry_topic: str = DEFAULT_REGISTRY_TOPIC
    #: Where the schema registry is (``KMQ_SCHEMA_REGISTRY_*``), for queues whose values are
    #: in the Schema Registry wire format.
    schema_registry: RegistrySettings = field(default_factory=RegistrySettings)

    def __post_init__(self) -> None:
        register_config_secrets(self.client_config)
        check_bootstrap_servers(self.bootstrap_servers)
        for name in ("session_timeout_ms", "request_timeout_ms", "fetch_wait_max_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"{name} must be positive, got {getattr(self, name)}", setting=name
                )
        # the defaults of new queues, checked as the queue's settings (core/queue_settings.py)
        check_settings(self, QUEUE_SETTINGS)
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ConfigError(
                f"batch_size must be between 1 and {MAX_BATCH_SIZE:,}, got {self.batch_size}",
                setting="batch_size",
            )
        if not self.retry_delays_ms or any(delay_ms <= 0 for delay_ms in self.retry_delays_ms):
            raise ConfigError("retry delays must be positive", setting="retry_delays_ms")

    def __repr__(self) -> str:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["client_config"] = mask_config(self.client_config)
        return f"KmqSettings({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> KmqSettings:
        """Build settings from ``KMQ_*`` variables, then apply ``overrides`` (flags) on top.

        Overrides whose value is ``None`` are ignored, so unset CLI flags fall through.

        Raises:
            ConfigError: a variable has a value of the wrong form.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if "KMQ_BOOTSTRAP_SERVERS" in env:
            values["bootstrap_servers"] = env["KMQ_BOOTSTRAP_SERVERS"]
        if "KMQ_CLIENT_ID" in env:
            values["client_id"] = env["KMQ_CLIENT_ID"]
        for name in ("session_timeout_ms", "request_timeout_ms", "fetch_wait_max_ms"):
            if (raw := env.get(f"KMQ_{name.upper()}")) is not None:
                values[name] = _parse_int(f"KMQ_{name.upper()}", raw)
        if (raw := env.get("KMQ_VISIBILITY_TIMEOUT")) is not None:
            values["visibility_timeout_ms"] = parse_duration_ms(raw)
        for name in ("max_redeliveries", "batch_size"):
            if (raw := env.get(f"KMQ_{name.upper()}")) is not None:
                values[name] = _parse_int(f"KMQ_{name.upper()}", raw)
        if (raw := env.get("KMQ_RETRY_DELAYS")) is not None:
            values["retry_delays_ms"] = parse_delay_list(raw)
        if env.get("KMQ_REGISTRY_TOPIC"):
            values["registry_topic"] = env["KMQ_REGISTRY_TOPIC"]
        values["client_config"] = {
            key[len(_CLIENT_PREFIX) :].lower().replace("_", "."): value
            for key, value in env.items()
            if key.startswith(_CLIENT_PREFIX)
        }
        values["schema_registry"] = RegistrySettings.from_env(env)
        settings = cls(**values)
        return settings.with_overrides(**overrides)

    def retry_policy(self, **options: Any) -> RetryPolicy:
        """The retry policy the retry settings' textual options describe (``delays``,
        ``backoff``, ``max_attempts``, ``jitter``: see :meth:`RetryPolicy.from_options`); none
        given: one retry per delay of ``KMQ_RETRY_DELAYS`` (``retry_delays_ms``).

        Raises:
            ConfigError: contradictory or malformed options.
        """
        return RetryPolicy.from_options(**options, default_delays_ms=self.retry_delays_ms)

    def define_queue(
        self,
        topic: str,
        group: str,
        *,
        partitions: int | None = None,
        retry_policy: RetryPolicy | None = None,
        visibility_timeout_ms: int | None = None,
        max_redeliveries: int | None = None,
    ) -> Queue:
        """A queue to provision, these settings' ``KMQ_*`` defaults for what is not given
        (``None``): ``KMQ_RETRY_DELAYS``, ``KMQ_VISIBILITY_TIMEOUT``, ``KMQ_MAX_REDELIVERIES``.

        Raises:
            ConfigError: an illegal name or an out-of-range value.
        """
        return Queue(
            topic,
            group,
            partitions=partitions,
            retry_policy=retry_policy or self.retry_policy(),
            visibility_timeout_ms=(
                self.visibility_timeout_ms
                if visibility_timeout_ms is None
                else visibility_timeout_ms
            ),
            max_redeliveries=(
                self.max_redeliveries if max_redeliveries is None else max_redeliveries
            ),
        )

    def with_overrides(self, **overrides: Any) -> KmqSettings:
        """A copy with the non-``None`` overrides applied (``client_config`` entries merge)."""
        given = {key: value for key, value in overrides.items() if value is not None}
        if "client_config" in given:
            given["client_config"] = {**self.client_config, **given["client_config"]}
        return dataclasses.replace(self, **given)

    def common_client_config(self) -> dict[str, Any]:
        """Settings every confluent-kafka client of kmq gets."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            **self.client_config,
        }

    def admin_config(self) -> dict[str, Any]:
        """Configuration for an ``AdminClient``."""
        return self.common_client_config()

    def producer_config(self, **extra: Any) -> dict[str, Any]:
        """Configuration for a ``Producer``: acks from every in-sync replica.

        Not idempotent unless ``-X enable.idempotence=true`` asks for it: kmq's guarantees rest
        on ``acks=all`` alone (a retried record written twice is a duplicate, never a loss),
        while an idempotent retry trusts the broker's sequence check. The embedded broker,
        restarted after a SIGKILL, answered "duplicate sequence number" for a batch it had
        not stored, which the client takes as success: acknowledged records were lost.
        """
        return {
            "enable.idempotence": False,
            **self.common_client_config(),
            "acks": "all",
            "message.max.bytes": self._producer_message_max_bytes(),
            **extra,
        }

    def _producer_message_max_bytes(self) -> int | str:
        """``-X message.max.bytes`` if given, else :data:`PRODUCER_MESSAGE_MAX_BYTES`; a
        value that is not a number is passed on for librdkafka to refuse by name."""
        asked = self.client_config.get("message.max.bytes")
        if asked is None:
            return PRODUCER_MESSAGE_MAX_BYTES
        try:
            return int(asked)
        except ValueError:
            return str(asked)

    def fetch_limits(self, **kmq_limits: int) -> dict[str, int]:
        """kmq's bounds on a consumer's fetches (``fetch_max_bytes=...``, ``_`` for ``.``),
        derived from the user's settings: a bound set with ``-X`` / ``KMQ_KAFKA_*`` is the
        user's (left out here, so theirs applies), and ``fetch.max.bytes`` is never below the
        user's ``message.max.bytes`` (librdkafka refuses such a consumer). Kafka answers a
        fetch with at least one whole record however large, so these bound memory, not what
        can be read."""
        limits: dict[str, int] = {}
        for name, value in kmq_limits.items():
            setting = name.replace("_", ".")
            if setting not in self.client_config:
                limits[setting] = value
        if "fetch.max.bytes" in limits:
            try:
                asked = int(self.client_config.get("message.max.bytes", 0))
            except ValueError:  # librdkafka refuses it by name
                asked = 0
            limits["fetch.max.bytes"] = max(limits["fetch.max.bytes"], asked)
        return limits

    def consumer_config(self, group: str, **extra: Any) -> dict[str, Any]:
        """Configuration for a ``Consumer`` in ``group``: offsets are committed by kmq only.

        Tuning defaults come first so ``KMQ_KAFKA_*`` / ``-X`` can override them; the settings
        kmq's guarantees rest on come last and cannot be overridden that way.
        """
        return {
            "auto.offset.reset": "earliest",
            "session.timeout.ms": self.session_timeout_ms,
            "fetch.wait.max.ms": self.fetch_wait_max_ms,
            # librdkafka stops fetching a partition whose local queue is full and by default
            # looks again only after 1 s: a stall for any consumer that drains it quickly.
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            **self.common_client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            **extra,
        }


def parse_client_options(options: Iterable[str]) -> dict[str, str]:
    """Parse ``key=value`` pairs given with ``-X`` into a confluent-kafka config dict.

    Raises:
        ConfigError: an option has no ``=``.
    """
    parsed: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep:
            # Never echo the text: it may be a password typed in the wrong form.
            name, colon, _secret = option.partition(":")
            if colon and _SETTING_NAME.fullmatch(name):
                raise ConfigError(
                    f"client settings take NAME=VALUE: write {name}=..., not {name}:...",
                    setting="-X",
                )
            raise ConfigError(
                "client settings take NAME=VALUE; one has no '=' (not shown: it may be a secret)",
                setting="-X",
            )
        if not key.strip():
            register_secret(value)
            raise ConfigError(
                "client settings take NAME=VALUE; one has no name before its '='", setting="-X"
            )
        parsed[key.strip()] = value
    return parsed


def check_bootstrap_servers(servers: str) -> None:
    """Refuse a bootstrap list that is empty, has an empty entry, or carries credentials.

    Kafka takes ``host:port[,host:port...]`` (librdkafka also ``PROTOCOL://host:port``);
    credentials go in ``sasl.*`` settings. A ``user:password@host`` entry is refused without
    echoing it, its password registered as a secret so no later line shows it.

    Raises:
        ConfigError: the list is not one of Kafka's.
    """
    entries = servers.split(",")
    for entry in entries:
        credentials, at, _host = entry.rpartition("@")
        if at:
            register_secret(credentials.partition(":")[2] or credentials)
            raise ConfigError(
                "bootstrap servers are HOST:PORT[,HOST:PORT...] and carry no credentials; "
                "give them with -X sasl.username=... -X sasl.password=... (or KMQ_KAFKA_SASL_*)",
                setting="bootstrap_servers",
            )
    if not servers.strip():
        raise ConfigError("bootstrap servers must not be empty", setting="bootstrap_servers")
    if any(not entry.strip() for entry in entries):
        raise ConfigError(
            f"bootstrap servers have an empty entry: {servers!r}", setting="bootstrap_servers"
        )


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}", setting=name) from None
