"""A queue's declared formats, the codec's failures, and which of them the retry policy
dead-letters: pure, no broker, no registry server."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import DeadLetter, Retry, RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.errors import ConfigError
from kmq_dagster.schemas.codec import ValueCodec, decode_field, queue_codecs
from kmq_dagster.schemas.registry import RegistrySettings
from kmq_dagster.schemas.wire import UndecodableValue


def test_a_queue_stores_its_formats_and_definitions_stored_before_them_read_as_bytes() -> None:
    # given a queue of Avro values and JSON keys
    # (as provisioning stores it: with its auxiliary partition count)
    queue = Queue("orders", "billing", partitions=2, aux_partitions=1,
                  value_format=ValueFormat.AVRO, key_format=ValueFormat.JSON)  # fmt: skip
    stored = queue.definition()
    # when its definition is read back, and one written before formats existed
    old = {key: value for key, value in stored.items() if not key.endswith("_format")}
    # then the formats survive, and the old one's values are bytes
    assert Queue.from_definition(stored) == queue
    assert (stored["value_format"], stored["key_format"]) == ("avro", "json")
    assert Queue.from_definition(old).value_format is ValueFormat.BYTES
    assert Queue.from_definition(old).key_format is ValueFormat.BYTES


def test_a_format_given_by_name_is_checked_and_a_different_one_contradicts() -> None:
    queue = Queue("orders", "g", value_format="json_schema")  # type: ignore[arg-type]
    assert queue.value_format is ValueFormat.JSON_SCHEMA
    with pytest.raises(ConfigError, match="unknown value format 'xml'"):
        Queue("orders", "g", value_format="xml")  # type: ignore[arg-type]
    found = queue.contradictions(value_format=ValueFormat.AVRO)
    assert found == ["value format json-schema (given: avro)"]


def test_an_undecodable_value_is_dead_lettered_at_once_with_its_reason() -> None:
    policy = RetryPolicy.fixed((1_000, 2_000))
    rng = random.Random(7)
    # when decoding failed for the message's own fault, and when the registry did not answer
    fatal = policy.after_failure(1, "UndecodableValue", 0, rng, "first byte 0x7b, expected 0x00")
    outage = policy.after_failure(1, "RegistryUnavailable", 0, rng, "connection refused")
    # then the first goes to the DLQ saying why, the second is retried
    assert fatal == DeadLetter(1, "undecodable value: first byte 0x7b, expected 0x00")
    assert isinstance(outage, Retry)
    assert not policy.is_retryable(UndecodableValue("x"))


def test_json_values_decode_and_text_that_is_not_json_is_undecodable() -> None:
    codec = ValueCodec("json", RegistrySettings(), topic="orders")
    assert codec.decode(b'{"id": 1}') == {"id": 1}
    assert codec.decode(None) is None  # a tombstone stays one
    for raw in (b"{not json", b"\xff\xfe"):
        with pytest.raises(UndecodableValue, match="not JSON text"):
            codec.decode(raw)


def test_registry_values_without_the_wire_header_are_undecodable_before_any_request() -> None:
    # no URL: a request would be a ConfigError, so these fail on the bytes alone
    codec = ValueCodec("avro", RegistrySettings(), topic="orders")
    with pytest.raises(UndecodableValue, match="first byte 0x7b"):
        codec.decode(b'{"id": 1}')
    with pytest.raises(UndecodableValue, match="too short"):
        codec.decode(b"\x00\x00\x01")
    with pytest.raises(ConfigError, match="KMQ_SCHEMA_REGISTRY_URL"):
        codec.decode(b"\x00\x00\x00\x00\x01\x02")


def test_protobuf_needs_the_generated_message_class() -> None:
    codec = ValueCodec("protobuf", RegistrySettings("mock://protobuf-unit"), topic="orders")
    with pytest.raises(ConfigError, match=r"message.decoded\(Order\)"):
        codec.decode(b"\x00\x00\x00\x00\x01\x00\x08\x01")


def test_a_queue_of_bytes_has_no_codecs_and_decoded_gives_its_bytes() -> None:
    registry = RegistrySettings()
    assert queue_codecs("orders", ValueFormat.BYTES, ValueFormat.BYTES, registry) is None
    assert decode_field(None, "value", b"\x01raw", None) == b"\x01raw"
    codecs = queue_codecs("orders", ValueFormat.JSON, ValueFormat.BYTES, registry)
    assert codecs is not None and codecs.key is None
    assert decode_field(codecs, "key", b"k1", None) == b"k1"


def test_numeric_registry_settings_from_the_environment_are_numbers() -> None:
    env = {"KMQ_SCHEMA_REGISTRY_URL": "http://r:8081", "KMQ_SCHEMA_REGISTRY_MAX_RETRIES": "0",
           "KMQ_SCHEMA_REGISTRY_TIMEOUT": "2.5"}  # fmt: skip
    config = RegistrySettings.from_env(env).client_config()
    assert (config["max.retries"], config["timeout"]) == (0, 2.5)
    bad = RegistrySettings.from_env({**env, "KMQ_SCHEMA_REGISTRY_MAX_RETRIES": "many"})
    with pytest.raises(ConfigError, match=r"max\.retries must be a number"):
        bad.client_config()


def test_importing_the_worker_and_spark_tasks_never_loads_the_schema_registry_client() -> None:
    code = (
        "import sys, kmq_dagster, kmq_dagster.worker.worker, kmq_dagster.spark.tasks\n"
        "from kmq_dagster.schemas.codec import ValueCodec\n"
        "from kmq_dagster.schemas.registry import RegistrySettings\n"
        "ValueCodec('json', RegistrySettings(), topic='t').decode(b'{}')\n"
        "print(sorted(m for m in sys.modules if m.startswith('confluent_kafka.schema_registry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
