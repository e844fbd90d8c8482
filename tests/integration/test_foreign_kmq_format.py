"""A dead-letter topic in kmq's own format but named by itself (``--dlq-topic X --format kmq``:
another team's kmq queue, or a share group's DLQ read as kmq records), ingested and replayed
with ``kmq ingest`` / ``kmq replay`` on the real broker and a real SQLite store: to a topic the
operator names, at the rate asked for, once per dead letter, each copy keeping its headers and
carrying ours, matched one to one by the audit rows."""

from __future__ import annotations

import math

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from sqlalchemy import select

from kmq_dagster.audit.models import DeadLetterEvent
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import ERROR_TYPE, normalize_headers
from kmq_dagster.core.replay import REPLAY_COUNT
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce_dead_letters, read_topic
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka

KEYS = [f"k{i}" for i in range(9)]
RATE = 4  # copies per second


def test_a_kmq_format_topic_named_by_itself_replays_to_a_chosen_topic_at_the_rate_asked(
    settings: KmqSettings, topic_name: str, private_audit_store: str
) -> None:
    queue = new_queue(settings, topic_name, "elsewhere", partitions=1)
    produce_dead_letters(settings, queue, [(key, "TimeoutError") for key in KEYS])
    dlt, target = queue.queue.dlq_topic, f"{topic_name}-redrive"
    admin = AdminClient(settings.admin_config())  # kept: a collected client cancels its request
    admin.create_topics([NewTopic(target, 1, 1)])[target].result(30)
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    source = ("--dlq-topic", dlt, "--format", "kmq")

    ingested = run_kmq("ingest", *source, "--once", env=env)
    assert ingested.returncode == 0, ingested.stderr
    assert f"{len(KEYS)} dead letters read, {len(KEYS)} new" in ingested.stdout

    replayed = run_kmq("replay", *source, "--to-topic", target, "--rate", str(RATE), env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {len(KEYS)} of {len(KEYS)} dead letters" in replayed.stdout
    again = run_kmq("replay", *source, "--to-topic", target, env=env)
    assert "replayed 0 of 0 dead letters" in again.stdout, again.stdout  # once per dead letter

    copies = read_topic(settings, target, 1, at_least=len(KEYS))
    assert sorted(c.key() or b"" for c in copies) == sorted(k.encode() for k in KEYS)
    for copy in copies:  # the message's own headers kept, ours added, the failure's dropped
        headers = dict(normalize_headers(copy.headers()))
        assert headers["trace"] == b"t-" + (copy.key() or b"") and headers[REPLAY_COUNT] == b"1"
        assert ERROR_TYPE not in headers, headers
    # at most RATE copies a second (sent a second's worth at a time): 9 copies at 4 a second
    # are three chunks, so their timestamps span at least two seconds
    stamps = sorted(c.timestamp()[1] for c in copies)
    assert stamps[-1] - stamps[0] >= (math.ceil(len(KEYS) / RATE) - 1) * 1_000 * 0.9, stamps

    store = AuditStore(private_audit_store)
    with store.session() as session:
        events = list(session.scalars(select(DeadLetterEvent)))
    store.close()
    assert sorted((e.copy_topic, e.copy_partition, e.copy_offset) for e in events) == sorted(
        (c.topic(), c.partition(), c.offset()) for c in copies
    )
