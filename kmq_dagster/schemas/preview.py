"""Schema Registry values decoded for display, with no user classes: the audit store's preview.

Given a value in the wire format (:mod:`~kmq_dagster.schemas.wire`), the registry is asked for
the writer's schema by id, and the value is decoded with it alone:

* Avro: fastavro's ``schemaless_reader`` with the parsed writer schema (named types of its
  references parsed first); bytes left over mean the schema does not fit.
* Protobuf: the schema is asked for as a serialized ``FileDescriptorProto`` (``fmt=
  "serialized"``), built into a descriptor pool of its own with its references (and the
  well-known types the process knows), the message found by the index list after the header,
  and shown as ``MessageToDict`` (field names as written in the ``.proto``).
* JSON Schema: the payload after the header is JSON text.

The answer is a :class:`ValuePreview`: the decoded value as JSON-able data, its format, schema
id, subject and version, or why it could not be decoded. Nothing here raises for a bad value or
a registry that does not answer: a preview is for reading, and must never stop an ingest. While
the registry does not answer, it is not asked again for :data:`REGISTRY_RETRY_AFTER_S`, so an
ingest of thousands of dead letters does not wait a timeout for each.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kmq_dagster.schemas.formats import ValueFormat
from kmq_dagster.schemas.registry import RegistrySettings, registry_client, registry_failure
from kmq_dagster.schemas.wire import (
    HEADER_LENGTH,
    MAGIC_BYTE,
    RegistryUnavailable,
    UndecodableValue,
    framed_schema_id,
)

#: Seconds the registry is not asked again after it did not answer.
REGISTRY_RETRY_AFTER_S = 30.0
#: Subjects a registry without the ``/schemas/ids/{id}/versions`` lookup is scanned through,
#: at most, to name a schema's subject and version.
MAX_SUBJECTS_SCANNED = 200
#: What a preview's reason starts with when the registry did not answer.
REGISTRY_UNAVAILABLE = "registry unavailable"

_FORMATS = {
    "AVRO": ValueFormat.AVRO,
    "PROTOBUF": ValueFormat.PROTOBUF,
    "JSON": ValueFormat.JSON_SCHEMA,
}


@dataclass(frozen=True)
class ValuePreview:
    """A framed value decoded for display, or why it could not be."""

    schema_id: int | None
    format: ValueFormat | None = None
    subject: str | None = None
    version: int | None = None
    #: The decoded value as JSON-able data (``None`` when undecodable).
    value: Any = None
    #: Why the value could not be decoded; ``None`` when it was.
    undecodable: str | None = None

    @property
    def decoded(self) -> bool:
        return self.undecodable is None


def is_framed(raw: bytes | None) -> bool:
    """Whether ``raw`` starts like a Schema Registry value (magic byte, room for an id)."""
    return raw is not None and len(raw) >= HEADER_LENGTH and raw[0] == MAGIC_BYTE


class SchemaPreviewer:
    """Decodes framed values with one registry client; parsed schemas are kept per id."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._readers: dict[int, tuple[ValueFormat, Callable[[bytes], Any]]] = {}
        self._names: dict[int, tuple[str | None, int | None]] = {}
        self._down_until = 0.0
        self._down_reason = ""
        self._lock = threading.Lock()

    def preview(self, raw: bytes) -> ValuePreview:
        """``raw`` decoded, or a preview that says why not (never raises)."""
        try:
            schema_id = framed_schema_id(raw)
        except UndecodableValue as exc:
            return ValuePreview(None, undecodable=str(exc))
        with self._lock:
            try:
                fmt, read = self._reader(schema_id)
            except UndecodableValue as exc:
                return ValuePreview(schema_id, undecodable=str(exc))
            except RegistryUnavailable as exc:
                return ValuePreview(schema_id, undecodable=f"{REGISTRY_UNAVAILABLE}: {exc}")
            subject, version = self._subject_version(schema_id)
        try:
            value = json_ready(read(raw[HEADER_LENGTH:]))
        except Exception as exc:  # any payload that does not fit its schema, whatever breaks
            reason = f"does not fit {fmt.value} schema {schema_id}: {type(exc).__name__}: {exc}"
            return ValuePreview(schema_id, fmt, subject, version, undecodable=reason)
        return ValuePreview(schema_id, fmt, subject, version, value=value)

    def _reader(self, schema_id: int) -> tuple[ValueFormat, Callable[[bytes], Any]]:
        if schema_id in self._readers:
            return self._readers[schema_id]
        if self._clock() < self._down_until:
            raise RegistryUnavailable(self._down_reason)
        try:
            schema = self._client.get_schema(schema_id)
            fmt = _FORMATS.get((schema.schema_type or "AVRO").upper())
            if fmt is None:
                raise UndecodableValue(f"schema {schema_id} has an unknown type")
            if fmt is ValueFormat.PROTOBUF and not _is_serialized(schema.schema_str):
                schema = self._serialized(schema_id)
            read = _reader_of(self._client, fmt, schema)
        except (UndecodableValue, RegistryUnavailable):
            raise
        except Exception as exc:
            failure = registry_failure(exc) if _from_registry(exc) else _schema_fault(exc)
            if isinstance(failure, RegistryUnavailable):
                self._down_until = self._clock() + REGISTRY_RETRY_AFTER_S
                self._down_reason = str(failure)
            raise failure from exc
        self._readers[schema_id] = fmt, read
        return fmt, read

    def _serialized(self, schema_id: int) -> Any:
        """A Protobuf schema as a serialized ``FileDescriptorProto``: a registry answers with
        ``.proto`` text unless asked for ``fmt="serialized"``, and the client caches a schema
        per subject and id whatever its format, so the ask names the subject."""
        subject, _version = self._subject_version(schema_id)
        if subject is None:
            raise UndecodableValue(f"the subject of Protobuf schema {schema_id} is unknown")
        return self._client.get_schema(schema_id, subject_name=subject, fmt="serialized")

    def _subject_version(self, schema_id: int) -> tuple[str | None, int | None]:
        """The first subject and version the schema is registered under (names only: a
        registry that cannot tell leaves them unknown, the value is decoded all the same)."""
        if schema_id not in self._names:
            self._names[schema_id] = _subject_version(self._client, schema_id)
        return self._names[schema_id]


def _is_serialized(schema_str: str) -> bool:
    try:
        base64.b64decode(schema_str, validate=True)
    except ValueError:
        return False
    return True


def _from_registry(exc: BaseException) -> bool:
    """Whether ``exc`` is about asking the registry (an HTTP answer or no answer at all)."""
    return (
        getattr(exc, "http_status_code", None) is not None
        or isinstance(exc, OSError)
        or (type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests"))
    )


def _schema_fault(exc: BaseException) -> UndecodableValue:
    return UndecodableValue(f"its schema cannot be read: {type(exc).__name__}: {exc}")


def _subject_version(client: Any, schema_id: int) -> tuple[str | None, int | None]:
    # confluent-kafka's in-process mock lacks this lookup (and its client would retry it with
    # waits of seconds); an older registry answers 404
    config = getattr(client, "config", None)
    config = config() if callable(config) else config
    in_process = str((config or {}).get("url", "")).startswith("mock://")
    try:
        pairs = [] if in_process else client.get_schema_versions(schema_id)
        if pairs:
            return pairs[0].subject, pairs[0].version
    except Exception:
        pass
    try:
        for subject in client.get_subjects()[:MAX_SUBJECTS_SCANNED]:
            for version in client.get_versions(subject):
                if client.get_version(subject, version).schema_id == schema_id:
                    return subject, version
    except Exception:
        pass
    return None, None


def _reader_of(client: Any, fmt: ValueFormat, schema: Any) -> Callable[[bytes], Any]:
    if fmt is ValueFormat.AVRO:
        return _avro_reader(client, schema)
    if fmt is ValueFormat.PROTOBUF:
        return _protobuf_reader(client, schema)
    return _json_reader


def _json_reader(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"))


def _avro_reader(client: Any, schema: Any) -> Callable[[bytes], Any]:
    from fastavro import parse_schema, schemaless_reader

    named: dict[str, Any] = {}
    for reference in _references(client, schema, fmt=None):
        parse_schema(json.loads(reference.schema_str), named_schemas=named)
    parsed = parse_schema(json.loads(schema.schema_str), named_schemas=named)

    def read(payload: bytes) -> Any:
        data = io.BytesIO(payload)
        record = schemaless_reader(data, parsed, None)
        left = len(payload) - data.tell()
        if left:
            raise ValueError(f"{left} bytes left after the record")
        return record

    return read


def _references(client: Any, schema: Any, *, fmt: str | None) -> list[Any]:
    """The schemas ``schema`` references, dependencies before their dependents."""
    found: list[Any] = []
    for reference in schema.references or []:
        registered = client.get_version(reference.subject, reference.version, fmt=fmt)
        found += [*_references(client, registered.schema, fmt=fmt), registered.schema]
    return found


def _protobuf_reader(client: Any, schema: Any) -> Callable[[bytes], Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    names = {reference.name for reference in schema.references or []}

    def add(name: str, schema_str: str) -> None:
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(base64.b64decode(schema_str))
        proto.name = proto.name or name
        if proto.name in added:
            return
        for dependency in proto.dependency:
            if dependency not in added and dependency not in names:
                _add_known(pool, dependency, added)
        pool.Add(proto)
        added.add(proto.name)

    for reference in schema.references or []:
        registered = client.get_version(reference.subject, reference.version, fmt="serialized")
        for nested in _references(client, registered.schema, fmt="serialized"):
            add("", nested.schema_str)
        add(reference.name, registered.schema.schema_str)
    add("schema.proto", schema.schema_str)
    main = descriptor_pb2.FileDescriptorProto()
    main.ParseFromString(base64.b64decode(schema.schema_str))
    package = f"{main.package}." if main.package else ""

    def read(payload: bytes) -> Any:
        data = io.BytesIO(payload)
        indexes = _message_indexes(data)
        full_name = _message_name(main, indexes, package)
        descriptor = pool.FindMessageTypeByName(full_name)
        message = message_factory.GetMessageClass(descriptor)()
        message.ParseFromString(data.read())
        return MessageToDict(message, preserving_proto_field_name=True)

    return read


def _add_known(pool: Any, name: str, added: set[str]) -> None:
    """A file the process knows (the well-known types), which registries do not store."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    try:
        known = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        raise UndecodableValue(f"its Protobuf schema imports {name}, which is unknown") from None
    for dependency in known.dependencies:
        if dependency.name not in added:
            _add_known(pool, dependency.name, added)
    proto = descriptor_pb2.FileDescriptorProto()
    known.CopyToProto(proto)
    pool.Add(proto)
    added.add(name)


def _message_indexes(data: io.BytesIO) -> list[int]:
    """The message-index list after the header: a zigzag count, then that many zigzag
    indexes; a count of 0 stands for ``[0]`` (the file's first message)."""
    count = _zigzag(data)
    if count < 0 or count > 100:
        raise ValueError(f"a message-index list of {count} entries")
    return [_zigzag(data) for _ in range(count)] if count else [0]


def _zigzag(data: io.BytesIO) -> int:
    value = shift = 0
    while True:
        byte = data.read(1)
        if not byte:
            raise ValueError("the message-index list ends early")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (value >> 1) ^ -(value & 1)
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _message_name(main: Any, indexes: list[int], package: str) -> str:
    """The full name of the message ``indexes`` point at (top level, then nested)."""
    messages, prefix = main.message_type, package
    for depth, index in enumerate(indexes):
        if not 0 <= index < len(messages):
            raise ValueError(f"message index {index} at depth {depth}: {len(messages)} there")
        found = messages[index]
        prefix = f"{prefix}{found.name}."
        messages = found.nested_type
    return prefix[:-1]


def json_ready(value: Any) -> Any:
    """``value`` with what JSON cannot hold written as text: bytes as base64, times in ISO
    8601, decimals and UUIDs as text."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    return value


_previewers: dict[tuple[tuple[str, str], ...], SchemaPreviewer] = {}
_previewers_lock = threading.Lock()


def previewer_from_env() -> SchemaPreviewer | None:
    """The process's previewer for the registry ``KMQ_SCHEMA_REGISTRY_*`` names (``None``: no
    registry is set, or the schemas extra is not installed)."""
    settings = RegistrySettings.from_env()
    if not settings.url:
        return None
    key = tuple(sorted(settings.client_config().items()))
    with _previewers_lock:
        if key not in _previewers:
            try:
                _previewers[key] = SchemaPreviewer(registry_client(settings))
            except Exception:  # no extra installed: values are shown as bytes
                return None
        return _previewers[key]
