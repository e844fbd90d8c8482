"""An audit store that stops taking writes (a full disk) under ``kmq replay`` and ``kmq discard``:
one error line, the action recorded as failed while the store still takes small writes, and
never a copy without a record. The disk fills for real: the kmq process runs with a file size
limit (RLIMIT_FSIZE: SQLite's writes past it fail as on a full disk), or SQLite's own
``max_page_count`` caps the database."""

from __future__ import annotations

import collections
import resource
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.errors import AuditStoreError
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.integration.test_replay_audit import (
    COUNT,
    GROUP,
    check_copies_against_records,
    copies,
    environment,
    fill,
    filled_environment,
    key_at,
    queue,
    replay_events,
)
from tests.kafka_helpers import produce_dead_letters
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

__all__ = ["queue"]  # the fixture, shared

#: What the WAL file of the store may grow to in a kmq process with a "full disk".
FULL_AT_BYTES = 256 * 1024


def run_on_a_full_disk(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    def limit_file_size() -> None:  # in the child, before exec: kmq's writes past it fail
        resource.setrlimit(resource.RLIMIT_FSIZE, (FULL_AT_BYTES, FULL_AT_BYTES))

    return subprocess.run(
        kmq_argv(*args), env=env, capture_output=True, text=True, timeout=180, check=False,
        preexec_fn=limit_file_size,
    )  # fmt: skip


def database_of(url: str) -> Path:
    path = Path(url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as connection:  # an empty WAL: it has FULL_AT_BYTES to grow
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def test_a_replay_on_a_full_disk_is_one_error_line_and_leaves_no_copy_unrecorded(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str, tmp_path: Path
) -> None:
    # given 3,000 dead letters in a store on a disk that fills during the replay
    env = filled_environment(settings, queue, private_audit_store, COUNT, tmp_path)
    database_of(private_audit_store)
    target = queue.queue.redelivery_topic

    # when `kmq replay` runs
    full = run_on_a_full_disk(env, "replay", "--topic", queue.topic, "--group", GROUP)

    # then it stops with one line saying what to do, and every copy it sent has a record
    assert full.returncode == 1, full.stderr
    assert full.stderr.count("\n") == 1 and "Traceback" not in full.stderr, full.stderr
    assert full.stderr.startswith("kmq: error: the audit store sqlite:///"), full.stderr
    assert "run the same replay again to resume" in full.stderr
    store = AuditStore(private_audit_store)
    (action,) = store.actions(queue_topic=queue.topic)
    assert action.state in ("failed", "interrupted"), action.outcome
    on_topic = copies(settings, target)
    events = replay_events(private_audit_store)
    check_copies_against_records(on_topic, events, [action])
    assert len(on_topic) < COUNT
    confirmed = {key_at(e) for e in events if e.state == "sent"}

    # and once the disk has room, the same replay finishes without sending a confirmed copy twice
    again = run_kmq("replay", "--topic", queue.topic, "--group", GROUP, env=env)
    assert again.returncode == 0, again.stderr
    keys = collections.Counter(copies(settings, target).values())
    assert len(keys) == COUNT
    assert not {key for key, n in keys.items() if n > 1} & confirmed
    store.close()


def test_a_discard_on_a_full_disk_is_one_error_line_and_discards_nothing(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str, tmp_path: Path
) -> None:
    env = filled_environment(settings, queue, private_audit_store, COUNT, tmp_path)
    database_of(private_audit_store)

    full = run_on_a_full_disk(env, "discard", "--topic", queue.topic, "--group", GROUP)

    assert full.returncode == 1, full.stderr
    assert full.stderr.count("\n") == 1 and "Traceback" not in full.stderr, full.stderr
    assert "refused to" in full.stderr and "nothing was discarded" in full.stderr, full.stderr
    store = AuditStore(private_audit_store)
    assert store.count_dead_letters(DeadLetterFilter(status="discarded")) == 0
    (action,) = store.actions(queue_topic=queue.topic)
    assert action.state in ("failed", "interrupted"), action.outcome
    store.close()


def capped(store: AuditStore) -> None:
    """Cap ``store``'s SQLite file at the pages it has: a new page fails as on a full disk,
    while a row updated in place still fits."""
    with store.engine.connect() as connection:
        pages = int(connection.exec_driver_sql("PRAGMA page_count").scalar_one())

    def cap(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count={pages}")

    event.listen(store.engine, "connect", cap)


def test_a_full_store_records_the_discard_and_the_replay_as_failed_while_small_writes_fit(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str
) -> None:
    fill(settings, queue, private_audit_store, COUNT)
    store = AuditStore(private_audit_store)
    capped(store)

    with pytest.raises(AuditStoreError, match=r"disk is full; nothing was discarded$"):
        store.discard(DeadLetterFilter(queue_topic=queue.topic), actor="ana", reason="old")
    with pytest.raises(AuditStoreError, match=r"run the same replay again to resume$"):
        replay_dead_letters(queue, ReplayRequest(), audit=store, actor="ana")

    assert store.count_dead_letters(DeadLetterFilter(status="new")) == COUNT
    discard, replay = store.actions(queue_topic=queue.topic)
    assert (discard.state, discard.count) == ("failed", 0)
    assert discard.outcome.startswith("failed, nothing discarded: the audit store")
    assert (replay.state, replay.count) == ("failed", 0)
    assert "refused to record the copies about to be sent" in replay.outcome
    assert copies(settings, queue.queue.redelivery_topic) == {}  # nothing sent unrecorded
    store.close()


def test_an_ingest_on_a_full_disk_is_one_error_line_and_the_next_one_stores_everything(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str, tmp_path: Path
) -> None:
    # given 3,000 dead letters on the DLQ, none in a store on a disk that fills during ingest
    produce_dead_letters(settings, queue, [(str(i), "TimeoutError") for i in range(COUNT)])
    AuditStore(private_audit_store).close()
    database_of(private_audit_store)
    env = environment(settings, private_audit_store, tmp_path)
    ingest = ("ingest", "--topic", queue.topic, "--group", GROUP, "--once")

    # when `kmq ingest --once` runs
    full = run_on_a_full_disk(env, *ingest)

    # then it stops with one error line, no warning and no traceback before it
    assert full.returncode == 1, full.stderr
    assert full.stderr.count("\n") == 1 and "Traceback" not in full.stderr, full.stderr
    assert full.stderr.startswith("kmq: error: "), full.stderr
    assert "refused to store the dead letters" in full.stderr and "nothing is lost" in full.stderr

    # and once the disk has room, ingest stores every dead letter, each once
    again = run_kmq(*ingest, env=env)
    assert again.returncode == 0, again.stderr
    store = AuditStore(private_audit_store)
    assert store.count_dead_letters(DeadLetterFilter(queue_topic=queue.topic)) == COUNT
    first, second = store.actions(queue_topic=queue.topic)
    assert first.state in ("failed", "interrupted") and second.state == "succeeded"
    if first.state == "failed":  # the store took the small write of its end
        assert first.count + second.count == COUNT
    store.close()
