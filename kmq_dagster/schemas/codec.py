"""Decoding and encoding a queue's values (or keys) in their declared format, with
confluent-kafka's own Schema Registry serializers.

A :class:`ValueCodec` is built from a format, the queue topic and the registry settings; it
imports ``confluent_kafka.schema_registry`` only when a registry format is first used, so a
queue of plain bytes never loads it. Decoding tells the two kinds of failure apart
(:mod:`kmq_dagster.schemas.wire`): :class:`UndecodableValue` (the message's fault: DLQ) and
:class:`RegistryUnavailable` (the registry's: retry).

Examples:
    >>> codec = ValueCodec("json", RegistrySettings(), topic="orders")
    >>> codec.decode(b'{"id": 7}')
    {'id': 7}
    >>> codec.encode({"id": 7})
    b'{"id": 7}'
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from kmq_dagster.core.retry import UNDECODABLE_KEY_MARK
from kmq_dagster.core.value_formats import ValueFormat, parse_value_format
from kmq_dagster.errors import ConfigError
from kmq_dagster.schemas.registry import (
    INSTALL_HINT,
    RegistrySettings,
    registry_client,
    registry_failure,
)
from kmq_dagster.schemas.wire import (
    RegistryUnavailable,
    UndecodableValue,
    framed_schema_id,
)

#: First byte of confluent-kafka's newer framing (a 16-byte schema GUID instead of an id).
_MAGIC_BYTE_GUID = 1


class ValueCodec:
    """Decodes and encodes one field (``value`` or ``key``) of one queue topic's messages.

    Args:
        value_format: the declared format (a :class:`ValueFormat` or its name).
        registry: where the schema registry is; needed by ``avro``, ``protobuf`` and
            ``json-schema`` only.
        topic: the queue topic: the subject a schema is registered under is ``<topic>-value``
            (confluent-kafka's default subject name strategy), whichever retry or redelivery
            topic a copy was read from.
        field: ``value`` or ``key``.
    """

    def __init__(
        self,
        value_format: ValueFormat | str,
        registry: RegistrySettings,
        *,
        topic: str,
        field: str = "value",
    ) -> None:
        self.format = parse_value_format(str(value_format))
        self.registry = registry
        self.topic = topic
        self.field = field
        self._deserializers: dict[type | None, Callable[..., Any]] = {}
        self._serializers: dict[tuple[str | None, type | None], Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ValueCodec({self.format.value!r}, topic={self.topic!r}, field={self.field!r})"

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, raw: bytes | None, value_type: type | None = None) -> Any:
        """The value ``raw`` holds: a dict for ``json``, ``avro`` and ``json-schema`` (or
        ``value_type(**fields)`` when given), a ``value_type`` message for ``protobuf``, the
        bytes themselves for ``bytes``. ``None`` (a tombstone) stays ``None``.

        Raises:
            UndecodableValue: the bytes are not in the format (wrong magic byte, too short,
                an unknown schema id, a payload that does not fit its schema).
            RegistryUnavailable: the schema registry did not answer (or refused the
                credentials): the value may be fine.
            ConfigError: ``protobuf`` without ``value_type``, no registry URL set, or the
                schemas extra not installed.
        """
        if raw is None or self.format is ValueFormat.BYTES:
            return raw
        if self.format is ValueFormat.JSON:
            try:
                return _built(json.loads(raw), value_type)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UndecodableValue(f"not JSON text: {exc}") from None
        if raw[:1] != bytes([_MAGIC_BYTE_GUID]):
            framed_schema_id(raw)  # raises for another first byte (naming it) or a short value
        deserializer = self._deserializer(value_type)
        decoded = _asking_registry(lambda: deserializer(raw, self._context()))
        if self.format is ValueFormat.PROTOBUF:
            return decoded
        return _built(decoded, value_type)

    def _deserializer(self, value_type: type | None) -> Callable[..., Any]:
        key = value_type if self.format is ValueFormat.PROTOBUF else None
        with self._lock:
            if key not in self._deserializers:
                self._deserializers[key] = self._new_deserializer(value_type)
            return self._deserializers[key]

    def _new_deserializer(self, value_type: type | None) -> Callable[..., Any]:
        client = registry_client(self.registry)
        serdes = _serdes()
        if self.format is ValueFormat.AVRO:
            return serdes.avro.AvroDeserializer(client)  # type: ignore[no-any-return]
        if self.format is ValueFormat.JSON_SCHEMA:
            return serdes.json_schema.JSONDeserializer(  # type: ignore[no-any-return]
                None, schema_registry_client=client
            )
        if value_type is None:
            raise ConfigError(
                f"protobuf {self.field}s decode to their generated message class: pass it, "
                f"e.g. message.decoded(Order) with Order from order_pb2",
                setting="value_type",
            )
        return serdes.protobuf.ProtobufDeserializer(  # type: ignore[no-any-return]
            value_type, {"use.deprecated.format": False}, schema_registry_client=client
        )

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, value: Any, *, schema: str | None = None) -> bytes | None:
        """``value`` encoded in the format.

        Args:
            value: a dict (``json``, ``avro``, ``json-schema``), a generated message object
                (``protobuf``: its class is the schema), bytes or text (``bytes``).
            schema: ``avro`` / ``json-schema``: the schema text, registered under the topic's
                subject if new. ``None``: the subject's latest registered schema.

        Raises:
            ConfigError: the value does not fit the schema, or the registry refused it.
            RegistryUnavailable: the registry did not answer.
        """
        if value is None:
            return None
        if self.format is ValueFormat.BYTES:
            return value.encode() if isinstance(value, str) else bytes(value)
        if self.format is ValueFormat.JSON:
            return json.dumps(value).encode()
        serializer = self._serializer(schema, type(value))
        try:
            encoded = _asking_registry(lambda: serializer(value, self._context()))
        except UndecodableValue as exc:  # the schema or subject is unknown: the caller's input
            raise ConfigError(f"cannot encode the {self.field}: {exc}") from None
        return bytes(encoded)

    def _serializer(self, schema: str | None, value_type: type) -> Callable[..., Any]:
        key = (schema, value_type if self.format is ValueFormat.PROTOBUF else None)
        with self._lock:
            if key not in self._serializers:
                self._serializers[key] = self._new_serializer(schema, value_type)
            return self._serializers[key]

    def _new_serializer(self, schema: str | None, value_type: type) -> Callable[..., Any]:
        client = registry_client(self.registry)
        serdes = _serdes()
        # A schema given is registered if new; without one, the subject's latest is used.
        conf = {"auto.register.schemas": True} if schema else _LATEST
        if self.format is ValueFormat.AVRO:
            return serdes.avro.AvroSerializer(  # type: ignore[no-any-return]
                client, schema, conf=conf
            )
        if self.format is ValueFormat.JSON_SCHEMA:
            return serdes.json_schema.JSONSerializer(  # type: ignore[no-any-return]
                schema, client, conf=conf
            )
        if not hasattr(value_type, "DESCRIPTOR"):
            raise ConfigError(
                f"a protobuf {self.field} is encoded from a generated message object, "
                f"got {value_type.__name__}"
            )
        return serdes.protobuf.ProtobufSerializer(  # type: ignore[no-any-return]
            value_type, client, {"use.deprecated.format": False}
        )

    def _context(self) -> Any:
        from confluent_kafka.serialization import MessageField, SerializationContext

        field = MessageField.KEY if self.field == "key" else MessageField.VALUE
        return SerializationContext(self.topic, field)


_LATEST = {"auto.register.schemas": False, "use.latest.version": True}


def _built(fields: Any, value_type: type | None) -> Any:
    if value_type is None or not isinstance(fields, dict):
        return fields
    return value_type(**fields)


def _asking_registry(call: Callable[[], Any]) -> Any:
    """``call()`` (a confluent-kafka serializer call), its failures told apart: the
    registry's (:class:`RegistryUnavailable`) from the value's (:class:`UndecodableValue`)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return call()
    except SchemaRegistryError as exc:
        raise registry_failure(exc) from None
    except (UndecodableValue, RegistryUnavailable, ConfigError):
        raise
    except Exception as exc:
        if _is_transport_error(exc):
            raise RegistryUnavailable(
                f"the schema registry did not answer: {type(exc).__name__}: {exc}"
            ) from None
        # Anything else is the bytes' fault: a short or misframed value (SerializationError),
        # a payload that does not fit its schema (fastavro, protobuf, jsonschema errors).
        raise UndecodableValue(f"{type(exc).__name__}: {exc}") from None


def _is_transport_error(exc: BaseException) -> bool:
    """No answer from the registry: httpx's transport errors (refused, reset, timed out, TLS),
    or an OAuth token that could not be fetched."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "HTTPError", "OAuthTokenError", "OSError"})


class _Serdes:
    def __init__(self) -> None:
        from confluent_kafka.schema_registry import avro, json_schema, protobuf

        self.avro = avro
        self.json_schema = json_schema
        self.protobuf = protobuf


@cache
def _serdes() -> _Serdes:
    """confluent-kafka's serializer modules, imported on first use."""
    try:
        return _Serdes()
    except ImportError as exc:
        raise ConfigError(f"Schema Registry support is missing: {INSTALL_HINT}") from exc


class QueueCodecs:
    """The value and key codecs of one queue (``None`` where its format is ``bytes``)."""

    __slots__ = ("key", "value")

    def __init__(self, value: ValueCodec | None, key: ValueCodec | None) -> None:
        self.value = value
        self.key = key


_queue_codecs: dict[tuple[Any, ...], QueueCodecs] = {}


def queue_codecs(
    topic: str, value_format: ValueFormat, key_format: ValueFormat, registry: RegistrySettings
) -> QueueCodecs | None:
    """The process's codecs of a queue topic (one per distinct formats and registry, so the
    serializers' schema caches are shared); ``None`` when both formats are ``bytes``."""
    if value_format is ValueFormat.BYTES and key_format is ValueFormat.BYTES:
        return None
    cache_key = (
        topic,
        value_format,
        key_format,
        registry.url,
        tuple(sorted(registry.config.items())),
    )
    with _codecs_lock:
        if cache_key not in _queue_codecs:
            _queue_codecs[cache_key] = QueueCodecs(
                _codec(value_format, registry, topic, "value"),
                _codec(key_format, registry, topic, "key"),
            )
        return _queue_codecs[cache_key]


_codecs_lock = threading.Lock()


def _codec(
    value_format: ValueFormat, registry: RegistrySettings, topic: str, field: str
) -> ValueCodec | None:
    if value_format is ValueFormat.BYTES:
        return None
    return ValueCodec(value_format, registry, topic=topic, field=field)


def decode_field(
    codecs: QueueCodecs | None, field: str, raw: bytes | None, value_type: type | None
) -> Any:
    """``raw`` (a message's value or key) decoded by its queue's codec; the bytes themselves
    when the queue declares no format for it."""
    codec = None if codecs is None else getattr(codecs, field)
    if codec is None:
        return raw
    if field == "value":
        return codec.decode(raw, value_type)
    try:
        return codec.decode(raw, value_type)
    except UndecodableValue as exc:  # the reason must say it was the key, not the value
        raise UndecodableValue(f"{UNDECODABLE_KEY_MARK}{exc}") from None
