"""A dead-letter topic written as Spring Kafka writes it, ingested with ``kmq ingest
--dlq-topic ... --format spring`` and replayed with ``kmq replay`` on the real broker and a real
SQLite store: every copy back on its original topic and partition, with its original headers
and our replay headers, matched one to one by the audit rows; a second replay sends nothing;
a dead letter whose headers name no origin is kept, with its reason, and never sent."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from sqlalchemy import select

from kmq_dagster.audit.models import Action, DeadLetter, DeadLetterEvent
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.replay import REPLAY_COUNT
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import read_topic
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka

ORIGINAL_PARTITIONS = 3
#: (original partition, original offset) of each well-formed Spring dead letter.
ORIGINS = [(0, 10), (2, 11), (1, 12), (2, 13)]
EXCEPTION = "org.springframework.kafka.listener.ListenerExecutionFailedException"


def spring_dead_letter(
    topic: str, partition: int, offset: int
) -> list[tuple[str, str | bytes | None]]:
    """The headers Spring Kafka's DeadLetterPublishingRecoverer adds (KafkaHeaders.DLT_*):
    UTF-8 strings, the partition a 4-byte and offset and timestamp 8-byte big-endian ints."""
    return [
        ("trace-id", f"t-{offset}".encode()),
        ("kafka_dlt-original-topic", topic.encode()),
        ("kafka_dlt-original-partition", struct.pack(">i", partition)),
        ("kafka_dlt-original-offset", struct.pack(">q", offset)),
        ("kafka_dlt-original-timestamp", struct.pack(">q", 1_764_201_600_000 + offset)),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"billing"),
        ("kafka_dlt-exception-fqcn", EXCEPTION.encode()),
        ("kafka_dlt-exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-exception-message", f"order {offset} declined".encode()),
        ("kafka_dlt-exception-stacktrace", b"java.lang.IllegalStateException: declined\n\tat x"),
    ]


def make_spring_dlt(settings: KmqSettings, original: str, dlt: str) -> None:
    admin = AdminClient(settings.admin_config())
    created = admin.create_topics([NewTopic(original, ORIGINAL_PARTITIONS, 1), NewTopic(dlt, 1, 1)])
    for future in created.values():
        future.result(30)
    producer = Producer(settings.producer_config())
    for partition, offset in ORIGINS:
        headers = spring_dead_letter(original, partition, offset)
        producer.produce(dlt, key=f"k{offset}".encode(), value=b'{"n": 1}', headers=headers)
    # a dead letter whose recoverer wrote no origin (a custom headers function, say)
    producer.produce(
        dlt, key=b"lost", value=b"?", headers=[("kafka_dlt-exception-fqcn", b"java.lang.Error")]
    )
    assert producer.flush(30) == 0


def test_a_spring_dlt_is_ingested_and_replayed_once_to_its_original_partitions(
    settings: KmqSettings, topic_name: str, private_audit_store: str
) -> None:
    original, dlt = topic_name, f"{topic_name}-dlt"
    make_spring_dlt(settings, original, dlt)
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    source = ("--dlq-topic", dlt, "--format", "spring")

    # when the DLT is ingested
    ingested = run_kmq("ingest", *source, "--once", env=env)
    assert ingested.returncode == 0, ingested.stderr
    assert "5 dead letters read, 5 new" in ingested.stdout

    store = AuditStore(private_audit_store)
    with store.session() as session:
        rows = list(session.scalars(select(DeadLetter).order_by(DeadLetter.dlq_offset)))
    # then every record has a row under the DLT and its format, with Spring's facts
    assert [(r.queue_topic, r.group_id) for r in rows] == [(dlt, "spring")] * 5
    good, lost = rows[:4], rows[4]
    assert [(r.original_topic, r.original_partition, r.original_offset) for r in good] == [
        (original, p, o) for p, o in ORIGINS
    ]
    assert {r.error_type for r in good} == {EXCEPTION}
    assert good[0].error_message == "order 10 declined"
    assert "consumer group billing" in good[0].reason
    assert lost.error_type == "java.lang.Error"
    assert "no kafka_dlt-original-topic header" in lost.reason

    # when it is replayed (to the original topic: the default for a foreign DLT), twice
    first = run_kmq("replay", *source, env=env)
    assert first.returncode == 0, first.stderr
    assert "replayed 4 of 5 dead letters" in first.stdout
    assert "left for want of an original topic 1" in first.stdout
    second = run_kmq("replay", *source, env=env)
    assert second.returncode == 0, second.stderr
    assert "replayed 0 of 0 dead letters" in second.stdout  # resumed after its end
    # and under another replay id, the loop guard counts the first replay of each
    guarded = run_kmq("replay", *source, "--replay-id", "again", "--max-replays", "1", env=env)
    assert guarded.returncode == 0, guarded.stderr
    assert "replayed 0 of 5 dead letters" in guarded.stdout
    assert "skipped at the replay limit 4" in guarded.stdout

    # then each well-formed dead letter is on its original partition exactly once
    copies = read_topic(settings, original, ORIGINAL_PARTITIONS, at_least=4)
    assert len(copies) == 4
    by_trace = {dict(normalize_headers(c.headers()))["trace-id"]: c for c in copies}
    assert sorted(by_trace, key=repr) == sorted((f"t-{o}".encode() for _, o in ORIGINS), key=repr)
    for partition, offset in ORIGINS:
        copy = by_trace[f"t-{offset}".encode()]
        headers = dict(normalize_headers(copy.headers()))
        assert copy.partition() == partition
        assert copy.key() == f"k{offset}".encode() and copy.value() == b'{"n": 1}'
        # keeping Spring's headers (its origin and error) and carrying our replay count
        assert headers["kafka_dlt-original-offset"] == struct.pack(">q", offset)
        assert headers["kafka_dlt-exception-fqcn"] == EXCEPTION.encode()
        assert headers[REPLAY_COUNT] == b"1"

    # and the audit rows name each copy where it is, under one replay action that sent them
    with store.session() as session:
        events = list(
            session.scalars(select(DeadLetterEvent).where(DeadLetterEvent.dlq_topic == dlt))
        )
        actions = list(session.scalars(select(Action).order_by(Action.id)))
        statuses = {r.dlq_offset: r.status for r in session.scalars(select(DeadLetter))}
    store.close()
    assert sorted((e.copy_topic, e.copy_partition, e.copy_offset) for e in events) == sorted(
        (c.topic(), c.partition(), c.offset()) for c in copies
    )
    assert {e.state for e in events} == {"sent"}
    assert [(a.kind, a.queue_topic, a.group_id, a.state, a.count) for a in actions] == [
        ("ingest", dlt, "spring", "succeeded", 5),
        ("replay", dlt, "spring", "succeeded", 4),
        ("replay", dlt, "spring", "succeeded", 0),
        ("replay", dlt, "spring", "succeeded", 0),
    ]
    assert {e.action_id for e in events} == {actions[1].id}
    assert statuses == {0: "replayed", 1: "replayed", 2: "replayed", 3: "replayed", 4: "new"}
