"""Previews against a registry over real HTTP (the REST double in ``tests/``), through
confluent-kafka's ``SchemaRegistryClient`` exactly as against a real one: the subject and version
come from ``/schemas/ids/{id}/versions``; a Protobuf schema, answered as ``.proto`` text, is asked
for again serialized; a registry answering 503 gives "registry unavailable" and is asked again
only after a pause."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from fastavro import parse_schema, schemaless_writer
from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

from kmq_dagster.schemas.preview import REGISTRY_RETRY_AFTER_S, SchemaPreviewer
from tests.schema_registry_double import SchemaRegistryDouble, StoredSchema
from tests.support.schema_values import AVRO_ORDER, protobuf_order

ORDER = {"order_id": "H-1", "password": "p", "amount": 2.5}


@pytest.fixture
def registry() -> Iterator[SchemaRegistryDouble]:
    with SchemaRegistryDouble() as double:
        yield double


def client_of(registry: SchemaRegistryDouble) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url, "max.retries": 0})


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def test_an_avro_value_gets_its_subject_and_version_from_the_registry(
    registry: SchemaRegistryDouble,
) -> None:
    registry.put(41, "orders-value", 3, StoredSchema(AVRO_ORDER))
    payload = io.BytesIO()
    schemaless_writer(payload, parse_schema(json.loads(AVRO_ORDER)), ORDER)

    preview = SchemaPreviewer(client_of(registry)).preview(framed(41, payload.getvalue()))

    assert (preview.value, preview.subject, preview.version) == (ORDER, "orders-value", 3)
    assert registry.asked("GET", "/schemas/ids/41/versions")


def test_a_protobuf_schema_answered_as_text_is_asked_for_serialized(
    registry: SchemaRegistryDouble,
) -> None:
    order = protobuf_order()
    proto = descriptor_pb2.FileDescriptorProto()
    order.DESCRIPTOR.file.CopyToProto(proto)
    registry.put(42, "orders-pb", 1, StoredSchema(
        'syntax = "proto3";\npackage shop;\nmessage Order { ... }', "PROTOBUF",
        serialized=base64.b64encode(proto.SerializeToString()).decode(),
    ))  # fmt: skip
    message = order(order_id="H-2", password="p", amount=1.5)

    preview = SchemaPreviewer(client_of(registry)).preview(
        framed(42, b"\x00" + message.SerializeToString())
    )

    assert preview.value == {"order_id": "H-2", "password": "p", "amount": 1.5}
    asks = [r.query for r in registry.asked("GET", "/schemas/ids/42")]
    assert {"subject": "orders-pb", "format": "serialized"} in asks


def test_a_registry_answering_503_is_unavailable_then_asked_again_after_a_pause(
    registry: SchemaRegistryDouble,
) -> None:
    registry.put(43, "orders-js", 1, StoredSchema("{}", "JSON"))
    now = [1_000.0]
    previewer = SchemaPreviewer(client_of(registry), clock=lambda: now[0])
    value = framed(43, b'{"order_id": "H-3"}')
    registry.failing_with = 503

    first, second = previewer.preview(value), previewer.preview(value)
    asked_while_down = len(registry.requests)
    registry.failing_with = None
    now[0] += REGISTRY_RETRY_AFTER_S + 1
    third = previewer.preview(value)

    assert first.undecodable is not None and "registry unavailable" in first.undecodable
    assert "HTTP 503" in first.undecodable and second.undecodable == first.undecodable
    assert asked_while_down == 1
    assert third.value == {"order_id": "H-3"} and third.subject == "orders-js"
