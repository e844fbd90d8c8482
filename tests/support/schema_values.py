"""Values in the Schema Registry wire format, made by confluent-kafka's own serializers
(``AvroSerializer``, ``ProtobufSerializer``, ``JSONSerializer``) against a registry client, and
put in a queue's DLQ as the retry router writes dead letters."""

from __future__ import annotations

import functools
import json
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.settings import KmqSettings

#: An order with a secret in it, as Avro.
AVRO_ORDER = json.dumps({
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "password", "type": "string"},
               {"name": "amount", "type": "double"}],
})  # fmt: skip
#: The same order as JSON Schema.
JSON_ORDER = json.dumps({
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "password": {"type": "string"},
                   "amount": {"type": "number"}},
})  # fmt: skip
_FIELD_STRING, _FIELD_DOUBLE, _FIELD_MESSAGE, _OPTIONAL = 9, 1, 11, 1


@functools.cache
def protobuf_order() -> Any:
    """The message class of ``shop.Order`` (order_id, password, amount, a Timestamp), built
    from a descriptor: no generated code, as a registry-only reader would see it."""
    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop",
                                               syntax="proto3")  # fmt: skip
    proto.dependency.append("google/protobuf/timestamp.proto")
    order = proto.message_type.add(name="Order")
    order.field.add(name="order_id", number=1, type=_FIELD_STRING, label=_OPTIONAL)
    order.field.add(name="password", number=2, type=_FIELD_STRING, label=_OPTIONAL)
    order.field.add(name="amount", number=3, type=_FIELD_DOUBLE, label=_OPTIONAL)
    order.field.add(name="placed_at", number=4, type=_FIELD_MESSAGE, label=_OPTIONAL,
                    type_name=".google.protobuf.Timestamp")  # fmt: skip
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName("shop.Order")
    except KeyError:
        pool.Add(proto)
        descriptor = pool.FindMessageTypeByName("shop.Order")
    return message_factory.GetMessageClass(descriptor)


def encode(client: Any, fmt: str, topic: str, order: dict[str, Any]) -> bytes:
    """``order`` in the wire format of ``fmt`` (avro, protobuf, json-schema), its schema
    registered under ``<topic>-value``."""
    context = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        encoded = AvroSerializer(client, AVRO_ORDER)(order, context)
    elif fmt == "json-schema":
        encoded = JSONSerializer(JSON_ORDER, client)(order, context)
    else:
        message = protobuf_order()(**order)
        message.placed_at.seconds = 1_700_000_000
        serializer = ProtobufSerializer(protobuf_order(), client, {"use.deprecated.format": False})
        encoded = serializer(message, context)
    assert encoded is not None and encoded[0] == 0
    return bytes(encoded)


def produce_dead_letters(
    settings: KmqSettings, queue: Queue, items: list[tuple[bytes, str, bytes]]
) -> None:
    """Put (key, error type, value) dead letters in ``queue``'s DLQ as the retry router does."""
    producer = Producer(settings.producer_config())
    for index, (key, error_type, value) in enumerate(items):
        headers = copy_headers(
            Origin(queue.topic, 0, 1_000 + index, 1_700_000_000_000), queue.group,
            Failure(error_type, "cannot price it"), attempt=3, dlq_reason="failed 3 attempts",
        )  # fmt: skip
        producer.produce(queue.dlq_topic, key=key, value=value, partition=0,
                         headers=[*replace_headers([], headers)])  # fmt: skip
    assert producer.flush(30) == 0
