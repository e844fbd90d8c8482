"""The DLQ ingester on the real broker and a real SQLite store: every dead letter once, even
after a crash between the store's commit and Kafka's, and garbage gets a row too."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from kmq_dagster.audit.store import AuditStore, DeadLetterFilter
from kmq_dagster.core.headers import ERROR_TYPE
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.operations.audited_ingest import run_ingest
from kmq_dagster.operations.dlq_ingester import DlqIngester, IngestStats
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce_dead_letters

pytestmark = pytest.mark.kafka

GROUP = "billing"


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, GROUP, partitions=2, aux_partitions=2)


def test_every_dead_letter_is_stored_once_across_reruns(
    settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    produce_dead_letters(settings, queue, [(f"k{i}", "TimeoutError") for i in range(30)])

    first = DlqIngester(queue, store)
    stats = first.ingest_available()
    first.close()
    produce_dead_letters(settings, queue, [("late", "KeyError")])
    second = DlqIngester(queue, store)
    later = second.ingest_available()
    second.close()

    assert (stats.read, stats.stored) == (30, 30)
    assert (later.read, later.stored) == (1, 1)  # resumed where the first one stopped
    assert store.count_dead_letters(DeadLetterFilter(queue_topic=queue.topic)) == 31
    (late,) = store.dead_letters(DeadLetterFilter(key=b"late"))
    assert (late.error_type, late.reason, late.attempts) == ("KeyError", "failed 2 attempts", 2)
    assert (late.original_topic, late.status, late.group_id) == (queue.topic, "new", GROUP)


def test_a_crash_after_the_store_commit_duplicates_nothing(
    settings: KmqSettings, queue: OpenedQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    produce_dead_letters(settings, queue, [(f"k{i}", "TimeoutError") for i in range(40)])

    def crash(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("killed between the store's commit and Kafka's")

    monkeypatch.setattr(DlqIngester, "_commit", crash)
    doomed = DlqIngester(queue, store)
    with pytest.raises(RuntimeError, match="killed"):
        doomed.ingest_available()
    doomed.close()
    stored_before_crash = store.count_dead_letters()
    monkeypatch.undo()
    restarted = DlqIngester(queue, store)
    stats = restarted.ingest_available()
    restarted.close()

    assert stored_before_crash > 0
    assert stats.already_stored == stored_before_crash  # read again, not stored again
    assert store.count_dead_letters() == 40


def test_garbage_in_the_dlq_gets_a_row_and_ingestion_goes_on(
    settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    producer = Producer(settings.producer_config())
    target = queue.queue.dlq_topic
    producer.produce(target, value=None, key=None, partition=0)
    producer.produce(target, value=b"\xff" * 100_000, partition=0, headers=[(ERROR_TYPE, b"\xfe")])
    producer.produce(target, value=b"ok", partition=1, headers=[("kmq-attempt", b"NaN")])
    assert producer.flush(30) == 0

    ingester = DlqIngester(queue, store)
    stats = ingester.ingest_available()
    ingester.close()

    assert stats.stored == 3
    rows = {(d.dlq_partition, d.dlq_offset): d for d in store.dead_letters()}
    assert rows[(0, 0)].value is None and rows[(0, 0)].reason == "unknown"
    assert rows[(0, 1)].value_truncated and rows[(0, 1)].value_size == 100_000
    assert rows[(1, 0)].attempts == 1


def test_a_new_store_gets_every_dead_letter_the_group_ingested_before(
    settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    def ingest(store: AuditStore) -> IngestStats:
        ingester = DlqIngester(queue, store)
        try:
            return run_ingest(ingester, store, actor="ana")
        finally:
            ingester.close()

    # given 3 dead letters ingested into one store: the ingester group's offsets are at the end
    produce_dead_letters(settings, queue, [(f"k{i}", "TimeoutError") for i in range(3)])
    old = AuditStore(f"sqlite:///{tmp_path / 'old.db'}")
    assert ingest(old).stored == 3
    old.close()

    # when the store is replaced by a new one (recreated, moved to PostgreSQL, another URL)
    new = AuditStore(f"sqlite:///{tmp_path / 'new.db'}")
    first = ingest(new)

    # then the new store gets all 3 from the DLQ, and later ingests resume, not restart
    assert (first.read, first.stored) == (3, 3)
    assert new.count_dead_letters(DeadLetterFilter(queue_topic=queue.topic)) == 3
    produce_dead_letters(settings, queue, [("late", "KeyError")])
    later = ingest(new)
    assert (later.read, later.stored) == (1, 1)
    new.close()
