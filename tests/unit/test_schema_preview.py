"""Schema Registry values decoded for display with nothing but the registry (confluent-kafka's
in-process ``mock://`` registry; values made by its own serializers)."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from kmq_dagster.schemas.preview import SchemaPreviewer, is_framed
from tests.support.schema_values import encode

CONTEXT = SerializationContext("orders", MessageField.VALUE)


@pytest.fixture
def client() -> Any:
    return SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})


def nested_message_classes() -> tuple[Any, Any]:
    """``shop.Basket`` (first) and ``shop.Basket.Line`` (nested): indexes [0] and [0, 0]."""
    proto = descriptor_pb2.FileDescriptorProto(name="shop/basket.proto", package="shop",
                                               syntax="proto3")  # fmt: skip
    basket = proto.message_type.add(name="Basket")
    basket.field.add(name="basket_id", number=1, type=9, label=1)
    line = basket.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=9, label=1)
    line.field.add(name="api_key", number=2, type=9, label=1)
    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName("shop.Basket")
    except KeyError:
        pool.Add(proto)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        for name in ("shop.Basket", "shop.Basket.Line")
    )


def test_a_nested_protobuf_message_is_found_by_its_message_indexes(client: Any) -> None:
    _basket, line = nested_message_classes()
    config = {"use.deprecated.format": False}
    raw = ProtobufSerializer(line, client, config)(line(sku="S-1", api_key="k"), CONTEXT)

    preview = SchemaPreviewer(client).preview(raw)

    assert preview.value == {"sku": "S-1", "api_key": "k"} and preview.format == "protobuf"


def test_avro_logical_types_become_json_text(client: Any) -> None:
    schema = json.dumps({"type": "record", "name": "Paid", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                   "scale": 2}},
        {"name": "blob", "type": "bytes"},
    ]})  # fmt: skip
    at = datetime.datetime(2026, 11, 27, 8, 0, tzinfo=datetime.UTC)
    raw = AvroSerializer(client, schema)(
        {"at": at, "total": decimal.Decimal("12.50"), "blob": b"\x00\x01"}, CONTEXT
    )

    preview = SchemaPreviewer(client).preview(raw)

    assert preview.value == {"at": "2026-11-27T08:00:00+00:00", "total": "12.50", "blob": "AAE="}
    json.dumps(preview.value)


@pytest.mark.parametrize(
    ("fmt", "damage", "reason"),
    [
        ("avro", b"\x00", "bytes left after the record"),
        ("json-schema", b"}", "does not fit json-schema schema"),
    ],
)
def test_a_payload_that_does_not_fit_its_schema_says_why(
    client: Any, fmt: str, damage: bytes, reason: str
) -> None:
    raw = encode(client, fmt, "orders", {"order_id": "X", "password": "p", "amount": 1.0})

    preview = SchemaPreviewer(client).preview(raw + damage)

    assert not preview.decoded and reason in (preview.undecodable or "")
    assert preview.subject == "orders-value" and preview.version == 1


def test_only_values_starting_with_the_magic_byte_are_framed() -> None:
    assert is_framed(b"\x00\x00\x00\x00\x01")
    assert not is_framed(b'{"a": 1}') and not is_framed(b"\x00\x00") and not is_framed(None)
