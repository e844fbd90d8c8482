"""Schema Registry values through a real worker and broker: handlers read the decoded fields,
an undecodable value goes to the DLQ with its reason and its bytes untouched, and a registry
that does not answer delays a message (retry) rather than dead-lettering it.

Values are made with confluent-kafka's own serializers; in one process against its ``mock://``
registry, where the registry must go away and come back against the REST test double.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kmq_dagster.cli import main
from kmq_dagster.core.headers import DLQ_REASON, header_value, normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import ATTEMPT
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.schemas.registry import RegistrySettings, registry_client
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import group_of, produce, read_topic, running_worker, wait_for
from tests.processes import kmq_argv, stop
from tests.schema_helpers import ORDER_AVRO, fields_of, order_proto, serialized
from tests.schema_registry_double import SchemaRegistryDouble

pytestmark = pytest.mark.kafka

ORDERS = [{"id": 1, "customer": "ann"}, {"id": 2, "customer": "bob"}]
USER_INFO = "kmq-test:s3cret-pw"


def schema_queue(
    settings: KmqSettings, topic: str, value_format: str, registry: RegistrySettings
) -> OpenedQueue:
    """A one-partition queue of ``value_format`` values, retried after 1 s (4 attempts)."""
    queue = Queue(topic, group_of(topic), partitions=1,
                  retry_policy=RetryPolicy.fixed((1_000,) * 3),
                  value_format=ValueFormat(value_format))  # fmt: skip
    return provision_queue(settings.with_overrides(schema_registry=registry), queue).opened


def mock_registry() -> RegistrySettings:
    return RegistrySettings(f"mock://{uuid.uuid4().hex}")


@pytest.mark.parametrize("value_format", ["avro", "protobuf", "json-schema"])
def test_a_handler_reads_the_fields_of_schema_registry_values(
    settings: KmqSettings, topic_name: str, value_format: str
) -> None:
    registry = mock_registry()
    opened = schema_queue(settings, topic_name, value_format, registry)
    client = registry_client(registry)  # the mock's schemas live in this one client
    produce(settings, topic_name, [serialized(value_format, client, topic_name, o) for o in ORDERS])
    value_type = order_proto() if value_format == "protobuf" else None
    seen: list[dict[str, Any]] = []

    with running_worker(opened, lambda m: seen.append(fields_of(m.decoded(value_type)))) as worker:
        assert wait_for(lambda: len(seen) == 2), seen

    assert sorted(seen, key=lambda order: order["id"]) == ORDERS
    assert worker.stats.failed == 0


def test_undecodable_values_go_to_the_dlq_with_the_reason_and_their_original_bytes(
    settings: KmqSettings, topic_name: str
) -> None:
    registry = mock_registry()
    opened = schema_queue(settings, topic_name, "avro", registry)
    good = serialized("avro", registry_client(registry), topic_name, ORDERS[0])
    wrong_magic = b'{"id": 2, "customer": "bob"}'
    unknown_id = b"\x00\x00\x00\x03\xe7" + good[5:]  # schema id 999: never registered
    produce(settings, topic_name, [wrong_magic, good, unknown_id], headers=[("trace", b"\xff")])
    seen: list[dict[str, Any]] = []
    calls: list[bytes | None] = []

    def handle(message: KmqMessage) -> None:
        calls.append(message.value)
        seen.append(message.decoded())

    with running_worker(opened, handle):
        dead = read_topic(settings, opened.queue.dlq_topic, 1, at_least=2)
        assert wait_for(lambda: len(seen) == 1)

    assert seen == [ORDERS[0]]
    assert {record.value() for record in dead} == {wrong_magic, unknown_id}  # byte for byte
    reasons = {}
    for record in dead:
        headers = normalize_headers(record.headers())
        assert header_value(headers, "trace") == b"\xff"
        reasons[record.value()] = (header_value(headers, DLQ_REASON) or b"").decode()
    assert reasons[wrong_magic].startswith("undecodable value: not in the Schema Registry wire")
    assert "first byte 0x7b" in reasons[wrong_magic]
    assert reasons[unknown_id].startswith("undecodable value: unknown to the schema registry")
    assert calls.count(wrong_magic) == calls.count(unknown_id) == 1  # never retried
    assert read_topic(settings, opened.queue.first_retry_topic, 1, timeout_s=3) == []
    # and a replay sends the same bytes back to the group
    assert replay_dead_letters(opened, ReplayRequest()).replayed == 2
    again = read_topic(settings, opened.queue.redelivery_topic, 1, at_least=2)
    assert sorted(record.value() or b"" for record in again) == sorted([wrong_magic, unknown_id])


def test_a_handler_reads_a_schema_registry_key_and_an_undecodable_key_is_dead_lettered(
    settings: KmqSettings, topic_name: str, group: str
) -> None:
    registry = mock_registry()
    queue = Queue(topic_name, group, partitions=1, key_format=ValueFormat.AVRO)
    opened = provision_queue(settings.with_overrides(schema_registry=registry), queue).opened
    good_key = serialized("avro", registry_client(registry), topic_name, ORDERS[0],
                          MessageField.KEY)  # fmt: skip
    producer = Producer(settings.producer_config())
    for key in (good_key, b"plain-key"):
        producer.produce(topic_name, key=key, value=b"payload", partition=0)
    assert producer.flush(30) == 0
    seen: list[dict[str, Any]] = []

    with running_worker(opened, lambda m: seen.append(m.decoded_key())):
        dead = read_topic(settings, opened.queue.dlq_topic, 1, at_least=1)
        assert wait_for(lambda: len(seen) == 1)

    assert seen == [ORDERS[0]]  # the value, declared bytes, is left as it is
    (record,) = dead
    assert (record.key(), record.value()) == (b"plain-key", b"payload")  # byte for byte
    reason = (header_value(normalize_headers(record.headers()), DLQ_REASON) or b"").decode()
    assert reason.startswith("undecodable key: not in the Schema Registry wire format"), reason


def test_a_registry_that_does_not_answer_delays_the_message_until_it_is_back(
    settings: KmqSettings, topic_name: str
) -> None:
    double = SchemaRegistryDouble(USER_INFO).start()
    try:
        credentials = {"basic.auth.user.info": USER_INFO}
        producer_side = SchemaRegistryClient({"url": double.url, **credentials})
        value = serialized("avro", producer_side, topic_name, ORDERS[0])
        registry = RegistrySettings(double.url, {**credentials, "max.retries": "0"})
        opened = schema_queue(settings, topic_name, "avro", registry)
        produce(settings, topic_name, [value])
        double.stop()  # the registry goes away before the worker asks it
        seen: list[tuple[dict[str, Any], bytes | None]] = []

        def handle(message: KmqMessage) -> None:
            seen.append((message.decoded(), header_value(message.headers, ATTEMPT)))

        with running_worker(opened, handle):
            retried = read_topic(settings, opened.queue.first_retry_topic, 1, at_least=1)
            assert [record.value() for record in retried] == [value]
            double.start()  # back, on the same address
            assert wait_for(lambda: len(seen) == 1)

        decoded, attempt = seen[0]
        assert decoded == ORDERS[0]
        assert attempt is not None and int(attempt) >= 2  # a retried copy, not the original
        assert read_topic(settings, opened.queue.dlq_topic, 1, timeout_s=3) == []
        assert double.unauthorized == 0  # the worker's requests carried the credentials
        assert double.asked("GET", "/schemas/ids/1")
    finally:
        double.stop()


def test_kmq_send_encodes_json_input_with_the_registry_and_its_credentials(
    settings: KmqSettings,
    topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bootstrap = ["-b", settings.bootstrap_servers]
    assert main(["provision", "--topic", topic_name, "--partitions", "1", *bootstrap]) == 0
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(ORDER_AVRO)
    order = '{"id": 1, "customer": "ann"}'
    argv = ["send", "--topic", topic_name, *bootstrap, "--encode", "avro",
            "--schema-file", str(schema_file), "--value", order]  # fmt: skip
    with SchemaRegistryDouble(USER_INFO) as double:
        monkeypatch.setenv("KMQ_SCHEMA_REGISTRY_URL", double.url)
        monkeypatch.setenv("KMQ_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "kmq-test:wrong")
        monkeypatch.setenv("KMQ_SCHEMA_REGISTRY_MAX_RETRIES", "0")
        capsys.readouterr()
        assert main(argv) == 1
        refused = capsys.readouterr().err
        monkeypatch.setenv("KMQ_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", USER_INFO)
        assert main(argv) == 0
        records = read_topic(settings, topic_name, 1, at_least=1)
        reader = AvroDeserializer(
            SchemaRegistryClient({"url": double.url, "basic.auth.user.info": USER_INFO})
        )
        context = SerializationContext(topic_name, MessageField.VALUE)
        decoded = [reader(record.value(), context) for record in records]

    assert refused.startswith("kmq: error: the schema registry answered HTTP 401"), refused
    assert "wrong" not in refused  # the password is masked
    assert decoded == [ORDERS[0]]  # sent once: the refused command sent nothing
    assert double.asked("POST", f"/subjects/{topic_name}-value/versions")


def test_kmq_provision_stores_the_formats_and_refuses_other_ones_without_redefine(
    settings: KmqSettings, topic_name: str, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["provision", "--topic", topic_name, "-g", group, "--partitions", "1",
            "-b", settings.bootstrap_servers, "--key-format", "json"]  # fmt: skip
    assert main([*argv, "--value-format", "avro"]) == 0
    capsys.readouterr()

    assert main([*argv, "--value-format", "protobuf"]) == 1

    assert "value format avro (given: protobuf)" in capsys.readouterr().err
    stored = open_queue(settings, topic_name, group).queue
    assert (stored.value_format, stored.key_format) == (ValueFormat.AVRO, ValueFormat.JSON)


def test_a_kmq_worker_process_decodes_with_the_registry_of_its_environment(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path
) -> None:
    with SchemaRegistryDouble(USER_INFO) as double:
        registry = RegistrySettings(double.url, {"basic.auth.user.info": USER_INFO})
        schema_queue(settings, topic_name, "avro", registry)
        producer_side = SchemaRegistryClient({"url": double.url, "basic.auth.user.info": USER_INFO})
        produce(
            settings, topic_name, [serialized("avro", producer_side, topic_name, o) for o in ORDERS]
        )
        env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
               "KMQ_SESSION_TIMEOUT_MS": "6000", "KMQ_TEST_OUTPUT_DIR": str(tmp_path),
               "KMQ_SCHEMA_REGISTRY_URL": double.url,
               "KMQ_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": USER_INFO}  # fmt: skip
        decoded, log = tmp_path / "decoded.txt", tmp_path / "worker.log"
        worker = subprocess.Popen(
            kmq_argv("worker", "-t", topic_name, "-g", group,
                     "--handler", "tests.support.schema_handlers:record"),
            cwd=Path(__file__).resolve().parents[2], env=env, stderr=log.open("wb"),
        )  # fmt: skip
        try:
            assert wait_for(
                lambda: decoded.exists() and len(decoded.read_text().splitlines()) >= 2
            ), log.read_text()[-3000:]
        finally:
            stop(worker)

    assert sorted(map(json.loads, decoded.read_text().splitlines()), key=str) == ORDERS
    assert double.unauthorized == 0 and double.asked("GET", "/schemas/ids/1")
