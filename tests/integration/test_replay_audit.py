"""Audit before effect, proven on real processes: ``kmq replay`` killed mid-replay (SIGTERM,
SIGKILL) on the real broker and a real SQLite or PostgreSQL store, with the copies on the
target topic checked against the audit rows; two replays of one selection at once; the replay
limit across differently worded selections."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from sqlalchemy import select

from kmq_dagster.audit.local_postgres import fresh_database
from kmq_dagster.audit.models import Action, DeadLetterEvent
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.replay import REPLAY_COUNT, ReplaySelection
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import new_consumer
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce_dead_letters, read_topic
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

GROUP = "g"
PARTITIONS = 2
COUNT = 3_000
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def audit_url(request: pytest.FixtureRequest, private_audit_store: str) -> Iterator[str]:
    """The store every kmq process of the test writes to: SQLite, or PostgreSQL."""
    if request.param == "sqlite":
        yield private_audit_store
        return
    yield fresh_database(request.getfixturevalue("postgres_url"))


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    # a DLQ (and redelivery topic) of 2 partitions, as the queue's
    return new_queue(settings, topic_name, GROUP, partitions=PARTITIONS, retry_delays_ms=(1_000,),
                     aux_partitions=PARTITIONS)  # fmt: skip


def fill(settings: KmqSettings, queue: OpenedQueue, url: str, count: int) -> None:
    """``count`` dead letters keyed ``0``..``count-1``, ingested into the store at ``url``."""
    produce_dead_letters(settings, queue, [(str(i), "TimeoutError") for i in range(count)])
    store = AuditStore(url)
    ingester = DlqIngester(queue, store)
    ingester.ingest_available()
    ingester.close()
    store.close()


def environment(settings: KmqSettings, url: str, home: Path) -> dict[str, str]:
    return {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "KMQ_AUDIT_URL": url, "HOME": str(home)}  # fmt: skip


def filled_environment(
    settings: KmqSettings, queue: OpenedQueue, url: str, count: int, home: Path
) -> dict[str, str]:
    """``count`` dead letters ingested into the store at ``url`` (:func:`fill`); the
    environment of a ``kmq`` command on that store and the session's broker."""
    fill(settings, queue, url, count)
    return environment(settings, url, home)


def start_replay(
    env: dict[str, str], queue: OpenedQueue, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    argv = kmq_argv("replay", "--topic", queue.topic, "--group", GROUP, *extra)
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)  # fmt: skip


def wait_for_copies(
    settings: KmqSettings, target: str, at_least: int, process: subprocess.Popen[bytes]
) -> None:
    """Until ``at_least`` copies are on ``target`` (the replay is well under way)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if len(read_topic(settings, target, PARTITIONS, timeout_s=2)) >= at_least:
            return
    raise AssertionError(f"the replay did not get to {at_least} copies (exit {process.poll()})")


def copies(settings: KmqSettings, target: str) -> dict[tuple[int, int], bytes]:
    """Every copy on ``target``: (partition, offset) -> key (read to each partition's end:
    3 s read one partition of two on a loaded machine)."""
    return {(r.partition() or 0, r.offset() or 0): r.key() or b""
            for r in read_topic(settings, target, PARTITIONS, timeout_s=60)}  # fmt: skip


def replay_events(url: str) -> list[DeadLetterEvent]:
    store = AuditStore(url)
    try:
        with store.session() as session:
            return list(session.scalars(select(DeadLetterEvent).order_by(DeadLetterEvent.id)))
    finally:
        store.close()


def key_at(event: DeadLetterEvent) -> bytes:
    """The key of the dead letter an event is about: number i sits at i % 2, offset i // 2."""
    return str(event.dlq_offset * PARTITIONS + event.dlq_partition).encode()


def check_copies_against_records(
    on_topic: dict[tuple[int, int], bytes], events: list[DeadLetterEvent], actions: list[Action]
) -> None:
    """Every copy on the topic has a record; every confirmed record names a copy that is there
    with its dead letter's key; each action's count is its confirmed copies."""
    sent = [e for e in events if e.state == "sent"]
    for event in sent:
        assert on_topic.get((event.copy_partition or 0, event.copy_offset or 0)) == key_at(event)
    recorded_keys = {key_at(e) for e in events}
    unrecorded = [key for key in on_topic.values() if key not in recorded_keys]
    assert unrecorded == [], f"{len(unrecorded)} copies on the topic have no record"
    confirmed_copies = {(e.copy_partition, e.copy_offset) for e in sent}
    unconfirmed_keys = {key_at(e) for e in events if e.state != "sent"}
    for at, key in on_topic.items():
        assert at in confirmed_copies or key in unconfirmed_keys, (at, key)
    per_action = collections.Counter(e.action_id for e in sent)
    for action in actions:
        assert action.count == per_action[action.id], (action.id, action.outcome)


def replay_signalled_midway(
    settings: KmqSettings, queue: OpenedQueue, url: str, home: Path, signum: signal.Signals
) -> tuple[dict[str, str], subprocess.Popen[bytes]]:
    """A `kmq replay` of :data:`COUNT` dead letters at 300 a second, sent ``signum`` once 450
    copies are on the redelivery topic; its environment, and the process."""
    env = filled_environment(settings, queue, url, COUNT, home)
    replay = start_replay(env, queue, home / "first.log", "--rate", "300")
    wait_for_copies(settings, queue.queue.redelivery_topic, 450, replay)
    replay.send_signal(signum)
    return env, replay


def rerun_replay(
    settings: KmqSettings, queue: OpenedQueue, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], collections.Counter[bytes]]:
    """The same replay run again to its end: its outcome, and every copy on the redelivery
    topic by key (how many times each dead letter was copied in all)."""
    second = run_kmq("replay", "--topic", queue.topic, "--group", GROUP, env=env)
    assert second.returncode == 0, second.stderr
    return second, collections.Counter(copies(settings, queue.queue.redelivery_topic).values())


def test_a_replay_stopped_by_sigterm_records_every_copy_and_its_end_and_resumes_without_duplicates(
    settings: KmqSettings, queue: OpenedQueue, audit_url: str, tmp_path: Path
) -> None:
    # given 3,000 dead letters replayed at 300 a second
    # when it gets SIGTERM half-way through a chunk
    env, replay = replay_signalled_midway(settings, queue, audit_url, tmp_path, signal.SIGTERM)
    code = replay.wait(timeout=60)
    target = queue.queue.redelivery_topic

    # then it finished its chunk, recorded every copy and how it ended, and exited 143
    output = (tmp_path / "first.log").read_text()
    assert code == 143, output
    assert "Traceback" not in output
    store = AuditStore(audit_url)
    (action,) = store.actions(queue_topic=queue.topic)
    assert action.state == "stopped", action.outcome
    assert action.outcome.startswith("stopped (SIGTERM): replayed"), action.outcome
    on_topic = copies(settings, target)
    events = replay_events(audit_url)
    check_copies_against_records(on_topic, events, [action])
    assert 450 <= action.count == len(on_topic) < COUNT
    assert {e.state for e in events} == {"sent"}

    # and running it again sends the rest, none twice
    second, keys = rerun_replay(settings, queue, env)
    assert len(keys) == COUNT and max(keys.values()) == 1
    assert "possible duplicates 0" in second.stdout
    store.close()


def test_a_replay_killed_with_sigkill_reads_interrupted_and_its_rerun_sends_recorded_copies_once(
    settings: KmqSettings, queue: OpenedQueue, audit_url: str, tmp_path: Path
) -> None:
    # given a replay of 3,000 dead letters at 300 a second
    # when it is SIGKILLed mid-way
    env, replay = replay_signalled_midway(settings, queue, audit_url, tmp_path, signal.SIGKILL)
    replay.wait(timeout=30)
    target = queue.queue.redelivery_topic

    # then the next look shows it interrupted, with what it did; every copy has a record
    store = AuditStore(audit_url)
    (action,) = store.actions(queue_topic=queue.topic)
    assert action.state == "interrupted", action.outcome
    assert f"its process {action.owner} is gone" in action.outcome
    on_topic = copies(settings, target)
    events = replay_events(audit_url)
    check_copies_against_records(on_topic, events, [action])
    confirmed = {key_at(e) for e in events if e.state == "sent"}
    unconfirmed = {key_at(e) for e in events if e.state == "unconfirmed"}
    assert 0 < len(confirmed) < COUNT and len(unconfirmed) <= 100

    # and a rerun of the same replay sends no confirmed copy again, and reports the
    # unconfirmed ones it sends again as possible duplicates
    second, keys = rerun_replay(settings, queue, env)
    assert len(keys) == COUNT
    twice = {key for key, n in keys.items() if n > 1}
    assert not twice & confirmed, "a confirmed copy was sent again"
    assert twice <= unconfirmed
    assert f"possible duplicates {len(unconfirmed)}" in second.stdout, second.stdout
    assert f"the last run of this replay was interrupted (action #{action.id}" in second.stderr
    first, rerun = store.actions(queue_topic=queue.topic)
    check_copies_against_records(copies(settings, target), replay_events(audit_url), [first, rerun])
    assert rerun.state == "succeeded"
    store.close()


def test_two_replays_of_one_selection_at_once_replay_each_dead_letter_once(
    settings: KmqSettings, queue: OpenedQueue, audit_url: str, tmp_path: Path
) -> None:
    # given 1,000 dead letters
    env = filled_environment(settings, queue, audit_url, 1_000, tmp_path)
    target = queue.queue.redelivery_topic

    # when two operators run the same replay at the same moment (10 s each: they overlap)
    both = [start_replay(env, queue, tmp_path / f"{n}.log", "--rate", "100") for n in (1, 2)]
    codes = [process.wait(timeout=180) for process in both]

    # then every dead letter was copied once, one replay waiting for the other
    outputs = [(tmp_path / f"{n}.log").read_text() for n in (1, 2)]
    assert codes == [0, 0], outputs
    keys = collections.Counter(copies(settings, target).values())
    assert len(keys) == 1_000 and max(keys.values()) == 1
    assert sum("kmq: waiting for action #" in output for output in outputs) == 1, outputs
    store = AuditStore(audit_url)
    actions = store.actions(queue_topic=queue.topic)
    assert sorted(a.count for a in actions) == [0, 1_000]
    check_copies_against_records(copies(settings, target), replay_events(audit_url),
                                 actions)  # fmt: skip
    store.close()


def test_the_replay_limit_counts_per_dead_letter_however_since_is_worded(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str, tmp_path: Path
) -> None:
    # given 10 dead letters, and five wordings of "the last few hours" (five replay ids)
    env = filled_environment(settings, queue, private_audit_store, 10, tmp_path)
    now = datetime.now(UTC)
    wordings = ["3h", "4h ago", (now - timedelta(hours=5)).isoformat(timespec="seconds"),
                (now - timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M"),
                (now - timedelta(hours=7)).astimezone().isoformat()]  # fmt: skip

    # when each is replayed with --max-replays 3
    outputs = []
    for since in wordings:
        result = run_kmq("replay", "--topic", queue.topic, "--group", GROUP, "--since", since,
                         "--max-replays", "3", env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)

    # then each dead letter was replayed three times, with counts 1, 2 and 3
    records = read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, timeout_s=3)
    per_key: dict[bytes | None, list[bytes]] = collections.defaultdict(list)
    for record in records:
        per_key[record.key()].append(dict(normalize_headers(record.headers()))[REPLAY_COUNT] or b"")
    assert len(per_key) == 10, outputs
    assert {key: sorted(counts) for key, counts in per_key.items()} == {
        str(i).encode(): [b"1", b"2", b"3"] for i in range(10)
    }, outputs
    assert "skipped at the replay limit 10" in outputs[-1]


def test_a_replay_whose_progress_in_kafka_was_lost_sends_no_recorded_copy_again(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str
) -> None:
    # given a finished replay of 50 dead letters
    fill(settings, queue, private_audit_store, 50)
    store = AuditStore(private_audit_store)
    first = replay_dead_letters(queue, ReplayRequest(), audit=store, actor="ana")
    # when its progress in Kafka is lost (as after a kill between the store's confirmation
    # and the commit of its consumer group)
    done = new_consumer(settings, f"kmq-replay.{first.replay_id}")
    restart = [TopicPartition(queue.queue.dlq_topic, p, 0) for p in range(PARTITIONS)]
    done.commit(offsets=restart, asynchronous=False)
    done.close()

    again = replay_dead_letters(queue, ReplayRequest(), audit=store, actor="ana")

    # then the store's records keep it from sending any copy twice
    assert (first.replayed, again.scanned, again.replayed, again.already_replayed) == (
        50, 50, 0, 50)  # fmt: skip
    keys = collections.Counter(copies(settings, queue.queue.redelivery_topic).values())
    assert len(keys) == 50 and max(keys.values()) == 1
    store.close()


def test_a_replay_id_reused_for_another_selection_is_refused_naming_its_first_use(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str, tmp_path: Path
) -> None:
    # given 8 dead letters, two of them replayed under the id "fix-1", and the last hour's
    # replayed under "recent" (a relative time)
    env = filled_environment(settings, queue, private_audit_store, 8, tmp_path)
    base = ("replay", "--topic", queue.topic, "--group", GROUP, "--actor", "ana")
    first = run_kmq(*base, "--offsets", "0:0-1", "--replay-id", "fix-1", env=env)
    assert first.returncode == 0 and "replayed 2 of" in first.stdout, first.stderr
    recent = run_kmq(*base, "--since", "1h", "--replay-id", "recent", env=env)
    assert recent.returncode == 0 and "replayed 8 of" in recent.stdout, recent.stderr
    store = AuditStore(private_audit_store)
    used, _ = store.actions(queue_topic=queue.topic)

    # when the ids are given again with other selections, by the CLI and by the library the
    # console and the Dagster job call (a dry run too)
    other = run_kmq(*base, "--offsets", "1:0-3", "--replay-id", "fix-1", env=env)
    longer = run_kmq(*base, "--since", "2h", "--replay-id", "recent", env=env)
    to_original = run_kmq(*base, "--offsets", "0:0-1", "--replay-id", "fix-1",
                          "--to", "original", env=env)  # fmt: skip
    selection = ReplaySelection(offsets={1: ((0, 3),)})
    refused = []
    for dry_run in (False, True):
        request = ReplayRequest(selection, dry_run=dry_run, replay_id="fix-1")
        with pytest.raises(ConfigError) as caught:
            replay_dead_letters(queue, request, audit=store, actor="bo")
        refused.append(str(caught.value))

    # then each is an error naming the first use: its action, actor, time and selection
    for result in (other, to_original):
        assert result.returncode != 0, result.stdout
        assert f"replay id fix-1 is taken: action #{used.id} by ana at " in result.stderr
        assert "replayed offsets 0:0-1 to this group under it" in result.stderr, result.stderr
    assert longer.returncode != 0 and "replayed since 1h ago to this group" in longer.stderr
    assert all(f"action #{used.id} by ana at {used.at:%Y-%m-%d %H:%M:%S} UTC" in text
               for text in refused), refused  # fmt: skip
    # and nothing was replayed or recorded for them
    assert len(copies(settings, queue.queue.redelivery_topic)) == 10
    assert len(store.actions(queue_topic=queue.topic)) == 2

    # and the same selections under their ids still resume (a relative time as worded,
    # whatever the time now)
    again = run_kmq(*base, "--offsets", "0:0-1", "--replay-id", "fix-1", env=env)
    assert again.returncode == 0 and "replayed 0 of" in again.stdout, again.stderr
    reworded = run_kmq(*base, "--since", "60m ago", "--replay-id", "recent", env=env)
    assert reworded.returncode == 0 and "replayed 0 of" in reworded.stdout, reworded.stderr
    store.close()
