"""Dead letters in the Schema Registry wire format, ingested from the real broker into real
SQLite: stored as their decoded JSON with secrets masked, subject and version kept, found by the
text search by their fields (never by a masked secret), exported decoded; a framed value no
registry knows keeps a placeholder and its bytes in hex; a registry that does not answer never
stops an ingest. Values are made by confluent-kafka's serializers against its ``mock://``
registry, shared in this process (``registry_client``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.broker.ports import free_port
from kmq_dagster.console.rendering import export, row_preview, schema_text
from kmq_dagster.core.masking import DEFAULT_MASKER
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.schemas import RegistrySettings, registry_client
from kmq_dagster.schemas.preview import REGISTRY_UNAVAILABLE, SchemaPreviewer
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue
from tests.support.schema_values import AVRO_ORDER, encode, produce_dead_letters

pytestmark = pytest.mark.kafka

SECRET = "hunter2-s3cr3t"
#: A framed value whose schema id (999) the registry does not know.
UNKNOWN_ID = b"\x00\x00\x00\x03\xe7\x0eunknown"
ORDERS = {
    "avro": {"order_id": "A-100", "password": SECRET, "amount": 12.5},
    "protobuf": {"order_id": "P-200", "password": SECRET, "amount": 7.25},
    "json-schema": {"order_id": "J-300", "password": SECRET, "amount": 3.0},
}


@pytest.fixture(scope="module")
def stored(settings: KmqSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DLQ with an Avro, a Protobuf, a JSON Schema, an unknown-id and a plain JSON dead
    letter, ingested with ``KMQ_SCHEMA_REGISTRY_URL`` naming the registry; yields the store."""
    topic = f"schema-dl-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KMQ_SCHEMA_REGISTRY_URL", f"mock://{topic}")
        client = registry_client(RegistrySettings.from_env())
        # an older Order first: the dead letter's schema is version 2 of its subject
        old = json.loads(AVRO_ORDER)
        old["fields"] = old["fields"][:1]
        client.register_schema(f"{topic}.avro-value", Schema(json.dumps(old), "AVRO"))
        queue = new_queue(settings, topic, "billing").queue
        items = [
            (fmt.encode(), "PricingError", encode(client, fmt, f"{topic}.{fmt}", order))
            for fmt, order in ORDERS.items()
        ]
        plain = json.dumps({"order_id": "T-400", "password": SECRET}).encode()
        items += [(b"unknown", "PricingError", UNKNOWN_ID), (b"plain", "PricingError", plain)]
        produce_dead_letters(settings, queue, items)
        url = f"sqlite:///{tmp_path_factory.mktemp('schema-dl') / 'audit.db'}"
        store = AuditStore(url)
        ingester = DlqIngester(new_queue(settings, topic, "billing"), store)
        try:
            assert ingester.ingest_available().stored == 5
        finally:
            ingester.close()
            store.close()
    yield url


def row(url: str, key: bytes) -> DeadLetter:
    store = AuditStore(url)
    try:
        (found,) = store.dead_letters(DeadLetterFilter(key=key))
        return found
    finally:
        store.close()


@pytest.mark.parametrize("fmt", list(ORDERS))
def test_a_schema_dead_letter_is_stored_as_its_decoded_fields_with_the_secret_masked(
    stored: str, fmt: str
) -> None:
    dead_letter = row(stored, fmt.encode())

    document = json.loads(dead_letter.value or b"")
    assert {k: document[k] for k in ("order_id", "password", "amount")} == {
        **ORDERS[fmt], "password": "****"}  # fmt: skip
    if fmt == "protobuf":
        assert document["placed_at"] == "2023-11-14T22:13:20Z"  # a well-known type, decoded
    assert SECRET.encode() not in (dead_letter.value or b"")
    assert dead_letter.value_format == fmt and dead_letter.value_undecodable is None
    subject = f"{dead_letter.queue_topic}.{fmt}-value"
    version = 2 if fmt == "avro" else 1
    assert (dead_letter.schema_subject, dead_letter.schema_version) == (subject, version)
    assert schema_text(dead_letter) == (
        f"{fmt}, subject {subject} version {version} (schema id {dead_letter.schema_id})"
    )


def test_the_text_search_finds_a_decoded_field_and_never_the_masked_secret(stored: str) -> None:
    store = AuditStore(stored)
    try:
        for order in ORDERS.values():
            found = store.dead_letters(DeadLetterFilter(search=f'"{order["order_id"]}"'))
            assert [d.key for d in found] != [] and len(found) == 1, order
        assert store.count_dead_letters(DeadLetterFilter(search=SECRET)) == 0
        assert store.count_dead_letters(DeadLetterFilter(search="****")) == 4
    finally:
        store.close()


def test_a_plain_value_is_stored_as_before(stored: str) -> None:
    dead_letter = row(stored, b"plain")

    assert json.loads(dead_letter.value or b"") == {"order_id": "T-400", "password": "****"}
    assert dead_letter.schema_id is None and dead_letter.value_format is None
    assert schema_text(dead_letter) == ""


def test_an_undecodable_framed_value_shows_a_placeholder_and_its_bytes_in_hex(
    stored: str,
) -> None:
    dead_letter = row(stored, b"unknown")

    assert dead_letter.value == UNKNOWN_ID and dead_letter.schema_id == 999
    assert "unknown to the schema registry" in (dead_letter.value_undecodable or "")
    cell = row_preview(dead_letter, DEFAULT_MASKER)
    assert cell == "(undecodable, schema id 999) 0x00000003e70e756e6b6e6f776e"
    exported = export(dead_letter, DEFAULT_MASKER)
    assert exported["value"]["hex"] == UNKNOWN_ID.hex()
    assert "unknown to the schema registry" in exported["value"]["undecodable"]


def test_the_json_export_and_the_csv_cell_carry_the_decoded_masked_value(stored: str) -> None:
    dead_letter = row(stored, b"avro")

    exported = export(dead_letter, DEFAULT_MASKER)
    assert exported["value"] == {**ORDERS["avro"], "password": "****"}
    assert exported["value_format"] == "avro"
    assert exported["schema"] == {"id": dead_letter.schema_id,
                                  "subject": dead_letter.schema_subject, "version": 2}  # fmt: skip
    assert SECRET not in json.dumps(exported)
    cell = row_preview(dead_letter, DEFAULT_MASKER)
    assert json.loads(cell) == {**ORDERS["avro"], "password": "****"}


def test_a_registry_that_does_not_answer_leaves_a_placeholder_and_never_blocks_ingest(
    tmp_path: Path,
) -> None:
    """Connection refused: every dead letter is stored all the same, with the reason; the
    registry is asked once, not once per dead letter."""
    client = SchemaRegistryClient({"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0})
    asked: list[int] = []
    previewer = SchemaPreviewer(_Counting(client, asked))
    value = b"\x00\x00\x00\x00\x07" + b"\x02x"
    started = time.monotonic()
    rows: list[dict[str, Any]] = [
        dead_letter_row(
            dlq_topic="orders.billing.dlq",
            queue_topic="orders",
            group_id="billing",
            partition=0,
            offset=offset,
            key=None,
            value=value,
            headers=[],
            timestamp_ms=1_700_000_000_000,
            ingested_at=datetime.now(UTC),
            previewer=previewer,
        )
        for offset in range(50)
    ]
    assert time.monotonic() - started < 10
    assert asked == [7]
    assert all(r["value"] == value for r in rows)
    assert all((r["value_undecodable"] or "").startswith(REGISTRY_UNAVAILABLE) for r in rows)
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        assert store.add_dead_letters(rows) == 50
    finally:
        store.close()


class _Counting:
    """A registry client that notes the schema ids it is asked for."""

    def __init__(self, client: Any, asked: list[int]) -> None:
        self._client, self._asked = client, asked

    def get_schema(self, schema_id: int, **kwargs: Any) -> Any:
        self._asked.append(schema_id)
        return self._client.get_schema(schema_id, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
