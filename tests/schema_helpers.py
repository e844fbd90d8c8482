"""Order schemas in the three Schema Registry formats, and values made with confluent-kafka's
own serializers (as another team's producer would make them), for the schema tests."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "string"}],
    }
)
ORDER_JSON_SCHEMA = json.dumps(
    {
        "title": "Order",
        "type": "object",
        "properties": {"id": {"type": "integer"}, "customer": {"type": "string"}},
        "required": ["id", "customer"],
    }
)


@cache
def order_proto() -> Any:
    """The message class protoc would generate from
    ``syntax = "proto3"; package kmqtest; message Order { int64 id = 1; string customer = 2; }``
    (protoc is not installed here: built from its descriptor)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="kmqtest/order.proto", package="kmqtest", syntax="proto3"
    )
    order = file.message_type.add(name="Order")
    field = descriptor_pb2.FieldDescriptorProto
    order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order.field.add(name="customer", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.Default()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kmqtest.Order"))


def serialized(
    fmt: str, client: SchemaRegistryClient, topic: str, order: dict[str, Any],
    field: MessageField = MessageField.VALUE,
) -> bytes:  # fmt: skip
    """``order`` as confluent-kafka's serializer of ``fmt`` writes it for ``topic``'s values
    (or keys: ``field=MessageField.KEY``, subject ``<topic>-key``)."""
    context = SerializationContext(topic, field)
    if fmt == "avro":
        return bytes(AvroSerializer(client, ORDER_AVRO)(order, context))
    if fmt == "json-schema":
        return bytes(JSONSerializer(ORDER_JSON_SCHEMA, client)(order, context))
    proto = order_proto()
    serializer = ProtobufSerializer(proto, client, {"use.deprecated.format": False})
    return bytes(serializer(proto(**order), context))


def fields_of(decoded: Any) -> dict[str, Any]:
    """A decoded order's fields, whether a dict or a protobuf message."""
    if isinstance(decoded, dict):
        return decoded
    return {"id": decoded.id, "customer": decoded.customer}
