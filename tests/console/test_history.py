"""A dead letter's history: discards with their reason, replays with where the copy went and
whether it came back, across every dead letter of the same message; the upgrade from 0002
that gives stored dead letters their error pattern and header rows; and replay cancel."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import column, insert, select, table

from kmq_dagster.audit.browse import cause_counts, page
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.history import history
from kmq_dagster.audit.history_events import DEAD_LETTERED, DISCARD, REPLAY
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.audit.store import HEAD_REVISION, AuditStore, schema_revision
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.console.conftest import stored_row
from tests.kafka_helpers import (
    new_queue,
    produce_dead_letters,
    read_topic,
    running_worker,
    wait_for,
)
from tests.support.audit_revisions import engine_at_revision


def test_a_discard_is_in_the_history_of_each_dead_letter_it_touched(store_url: str) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n) for n in range(4)])

    count = store.discard(
        DeadLetterFilter(since=datetime.fromtimestamp(1_795_000_002, UTC)),
        actor="olivia", reason="test orders from the load test",
    )  # fmt: skip

    assert count == 2
    (action,) = store.actions()
    assert action.outcome == "discarded 2: test orders from the load test"
    discarded = page(store, DeadLetterFilter(status="discarded")).rows
    for letter in discarded:
        steps = [(e.kind, e.actor, e.detail) for e in history(store, letter)]
        assert steps == [(DEAD_LETTERED, None, "failed 4 attempts"),
                         (DISCARD, "olivia", "test orders from the load test")]  # fmt: skip
    (kept,) = page(store, DeadLetterFilter(key=b"k0")).rows
    assert [e.kind for e in history(store, kept)] == [DEAD_LETTERED]
    store.close()


def test_upgrading_from_0002_gives_stored_dead_letters_patterns_and_header_rows(
    store_url: str,
) -> None:
    engine = engine_at_revision(store_url, "0002")
    later = ("id", "error_pattern", "value_format", "schema_id", "schema_subject",
             "schema_version", "value_undecodable")  # fmt: skip
    old_columns = [c for c in DeadLetter.__table__.columns if c.name not in later]
    row = stored_row(5, headers=[("trace-id", b"abc")], message="order 77 timed out after 9 s")
    old_table = table("dead_letters", *(column(c.name, c.type) for c in old_columns))
    with engine.begin() as connection:
        connection.execute(insert(old_table).values({c.name: row[c.name] for c in old_columns}))
    engine.dispose()

    store = AuditStore(store_url)

    assert schema_revision(store.engine) == HEAD_REVISION
    (cause,) = cause_counts(store, DeadLetterFilter())
    assert cause.error_pattern == "order <n> timed out after <n> s"
    by_header = page(store, DeadLetterFilter(header=("trace-id", "abc"))).rows
    assert [d.dlq_offset for d in by_header] == [5]
    assert len(page(store, DeadLetterFilter(search="order 77")).rows) == 1
    with store.engine.connect() as connection:
        assert connection.execute(select(DeadLetter.key)).scalars().all() == [b"k5"]
    store.close()


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, partitions=2, retry_delays_ms=(1000,))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AuditStore]:
    """An audit store in a fresh SQLite file, closed after the test."""
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.close()


def ingest(settings: KmqSettings, store: AuditStore, queue: OpenedQueue) -> None:
    ingester = DlqIngester(queue, store)
    try:
        ingester.ingest_available()
    finally:
        ingester.close()


@pytest.mark.kafka
def test_a_replay_records_where_each_copy_went_and_a_copy_that_fails_again_links_back(
    settings: KmqSettings, queue: OpenedQueue, store: AuditStore
) -> None:
    produce_dead_letters(settings, queue, [("a", "TimeoutError"), ("b", "KeyError")])
    ingest(settings, store, queue)
    request = ReplayRequest()

    replay_dead_letters(queue, request, audit=store, actor="olivia")

    copies = read_topic(settings, queue.queue.redelivery_topic, 2, at_least=2)
    where = {r.key(): (r.topic(), r.partition(), r.offset()) for r in copies}
    (first_a,) = page(store, DeadLetterFilter(key=b"a")).rows
    steps = history(store, first_a)
    assert [(e.kind, e.actor) for e in steps] == [(DEAD_LETTERED, None), (REPLAY, "olivia")]
    assert (steps[1].copy_topic, steps[1].copy_partition, steps[1].copy_offset) == where[b"a"]
    assert steps[1].came_back_as is None and steps[1].detail == request.id_for(queue.queue)

    def fail(message: KmqMessage) -> None:
        if message.key == b"a":
            raise KeyError("still missing")

    with running_worker(queue, fail):
        assert wait_for(
            lambda: len(read_topic(settings, queue.queue.dlq_topic, 2, timeout_s=1)) == 3,
            timeout_s=60,
        )
    ingest(settings, store, queue)
    (second_a,) = page(store, DeadLetterFilter(key=b"a", status="new")).rows
    steps = history(store, first_a)
    assert [e.kind for e in steps] == [DEAD_LETTERED, REPLAY, DEAD_LETTERED]
    assert steps[1].came_back_as == second_a.id
    assert [e.dead_letter_id for e in history(store, second_a)] == [first_a.id, first_a.id,
                                                                    second_a.id]  # fmt: skip


@pytest.mark.kafka
def test_a_cancelled_replay_stops_early_is_audited_as_cancelled_and_resumes(
    settings: KmqSettings, queue: OpenedQueue, store: AuditStore
) -> None:
    produce_dead_letters(settings, queue, [(f"k{i}", "TimeoutError") for i in range(40)])
    cancel = threading.Event()
    request = ReplayRequest(rate_per_s=20)

    def cancel_after_some(report: object) -> None:
        cancel.set()

    first = replay_dead_letters(
        queue,
        request,
        audit=store,
        actor="olivia",
        cancel=cancel,
        progress=cancel_after_some,
    )
    rest = replay_dead_letters(queue, request, audit=store, actor="olivia")

    assert first.cancelled and 0 < first.replayed < 40
    assert first.replayed + rest.replayed == 40
    assert store.actions()[0].outcome.startswith("cancelled: replayed")
    copies = read_topic(settings, queue.queue.redelivery_topic, 2, at_least=40)
    assert sorted(r.key() or b"" for r in copies) == sorted(f"k{i}".encode() for i in range(40))
