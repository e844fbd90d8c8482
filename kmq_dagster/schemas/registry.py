"""Where the schema registry is, and the one client per process that asks it.

Settings come from the environment like the Kafka client's: ``KMQ_SCHEMA_REGISTRY_URL``, and
any confluent-kafka ``SchemaRegistryClient`` setting as ``KMQ_SCHEMA_REGISTRY_<NAME>`` (prefix
dropped, lower case, ``_`` becomes ``.``): ``KMQ_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:pw``,
``KMQ_SCHEMA_REGISTRY_SSL_CA_LOCATION=/etc/ca.pem``, ``..._SSL_CERTIFICATE_LOCATION``,
``..._SSL_KEY_LOCATION``. They are passed to the client untouched; the password is registered
as a secret, so no log line or error text shows it.

    >>> RegistrySettings.from_env({"KMQ_SCHEMA_REGISTRY_URL": "mock://orders"}).url
    'mock://orders'
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.errors import ConfigError
from kmq_dagster.schemas.wire import RegistryUnavailable, UndecodableValue
from kmq_dagster.secrets import mask_config, mask_url, register_secret, register_url_secrets

_PREFIX = "KMQ_SCHEMA_REGISTRY_"
#: Registry error codes 40400-40499 mean "this schema id, subject or version does not exist"
#: (40403: schema not found): the message names a schema nobody can find, so retrying cannot
#: help. A bare 404 without such a code (a wrong URL path) is the registry's fault, not the
#: message's: a misconfigured URL must not dead-letter every message.
_NOT_FOUND_CODES = range(40400, 40500)

#: Client settings confluent-kafka wants as numbers; from the environment they come as text.
_NUMERIC_SETTINGS = frozenset(
    {"max.retries", "retries.wait.ms", "retries.max.wait.ms", "timeout", "cache.capacity",
     "cache.latest.ttl.sec"}
)  # fmt: skip

INSTALL_HINT = "install the schemas extra: pip install -e '.[schemas]' in your kmq-dagster clone"


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is (``url``) and how to reach it (``config``: client settings)."""

    url: str | None = None
    #: Other ``SchemaRegistryClient`` settings (``basic.auth.user.info``, ``ssl.ca.location``).
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.url:
            register_url_secrets(self.url)
        user_info = self.config.get("basic.auth.user.info")
        if user_info and ":" in user_info:
            register_secret(user_info.split(":", 1)[1])

    def __repr__(self) -> str:
        url = mask_url(self.url) if self.url else None
        return f"RegistrySettings(url={url!r}, config={_masked(self.config)!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RegistrySettings:
        """Settings from ``KMQ_SCHEMA_REGISTRY_*`` variables (none set: no registry)."""
        env = os.environ if environ is None else environ
        config = {
            key[len(_PREFIX) :].lower().replace("_", "."): value
            for key, value in env.items()
            if key.startswith(_PREFIX) and key != f"{_PREFIX}URL"
        }
        return cls(url=env.get(f"{_PREFIX}URL") or None, config=config)

    def client_config(self) -> dict[str, Any]:
        """The settings as confluent-kafka's ``SchemaRegistryClient`` takes them.

        Raises:
            ConfigError: no URL is set.
        """
        if not self.url:
            raise ConfigError(
                "no schema registry: set KMQ_SCHEMA_REGISTRY_URL (a queue with an avro, "
                "protobuf or json-schema format needs one)",
                setting="schema_registry_url",
            )
        return {**{key: _typed(key, value) for key, value in self.config.items()}, "url": self.url}


def _typed(key: str, value: Any) -> Any:
    if key not in _NUMERIC_SETTINGS or not isinstance(value, str):
        return value
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        raise ConfigError(
            f"schema registry setting {key} must be a number, got {value!r}", setting=key
        ) from None


def _masked(config: Mapping[str, Any]) -> dict[str, Any]:
    masked = mask_config(config)
    if "basic.auth.user.info" in masked:
        masked["basic.auth.user.info"] = "***"
    return masked


_clients: dict[tuple[tuple[str, str], ...], Any] = {}
_clients_lock = threading.Lock()


def registry_client(settings: RegistrySettings) -> Any:
    """The process's ``SchemaRegistryClient`` for ``settings`` (one per distinct settings, so
    its schema cache, and a ``mock://`` registry's contents, are shared within the process).

    Raises:
        ConfigError: no URL is set, or the schemas extra is not installed.
    """
    config = settings.client_config()
    key = tuple(sorted(config.items()))
    with _clients_lock:
        if key not in _clients:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:
                raise ConfigError(f"Schema Registry support is missing: {INSTALL_HINT}") from exc
            _clients[key] = SchemaRegistryClient.new_client(config)
        return _clients[key]


def registry_failure(exc: BaseException) -> UndecodableValue | RegistryUnavailable:
    """What a failed registry request means for the message being decoded.

    A schema or subject the registry says does not exist (HTTP 404 with a not-found code) is the
    message's fault: :class:`UndecodableValue`. Anything else (no answer, a timeout, 401/403,
    5xx) is the registry's: :class:`RegistryUnavailable`, to be retried.
    """
    status = getattr(exc, "http_status_code", None)
    code = getattr(exc, "error_code", None)
    text = str(exc)
    if status == 404 and code in _NOT_FOUND_CODES:
        return UndecodableValue(f"unknown to the schema registry: {text}")
    if status is not None:
        return RegistryUnavailable(f"the schema registry answered HTTP {status}: {text}")
    return RegistryUnavailable(f"the schema registry did not answer: {type(exc).__name__}: {text}")
