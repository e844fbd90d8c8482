"""DLQ replay against the real broker: selection, dry run, targets, limits, rate, resumption."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Message

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import (
    DLQ_REASON,
    normalize_headers,
)
from kmq_dagster.core.replay import REPLAY_COUNT, ReplaySelection
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.topic_reader import assigned_reader
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.operations.replay import CHUNK, ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import (
    new_queue,
    produce_dead_letters,
    read_topic,
    running_worker,
    wait_for,
)
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

DELAY_MS = 1_000
PARTITIONS = 2
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(
        settings, topic_name, partitions=PARTITIONS, retry_delays_ms=(DELAY_MS,),
        aux_partitions=PARTITIONS,  # a DLQ of 2 partitions, as the queue's
    )  # fmt: skip


def dead_letter(
    settings: KmqSettings, queue: OpenedQueue, items: list[tuple[str, str]], *, replayed: int = 0
) -> None:
    produce_dead_letters(settings, queue, items, replayed=replayed)


def request(**options: object) -> ReplayRequest:
    return ReplayRequest(**options)  # type: ignore[arg-type]


def headers_of(record: Message) -> dict[str, bytes | None]:
    return dict(normalize_headers(record.headers()))


def test_a_dry_run_lists_the_selection_and_moves_nothing(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    dead_letter(settings, queue, [(f"t{i}", "TimeoutError") for i in range(5)])
    dead_letter(settings, queue, [(f"v{i}", "ValueError") for i in range(4)])
    only_timeouts = ReplaySelection(error_type="TimeoutError")

    dry = replay_dead_letters(queue, request(selection=only_timeouts, dry_run=True))

    assert (dry.scanned, dry.selected, dry.replayed) == (9, 5, 0)
    assert len(dry.listed) == 5 and all("TimeoutError" in line for line in dry.listed)
    assert read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, timeout_s=3) == []
    # a dry run records no progress: the real run still finds all five
    real = replay_dead_letters(queue, request(selection=only_timeouts))
    assert (real.selected, real.replayed) == (5, 5)
    assert real.by_error_type == {"TimeoutError": 5}


def test_replayed_dead_letters_are_processed_again_by_their_group(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError")])
    seen: list[KmqMessage] = []

    report = replay_dead_letters(queue, request(selection=ReplaySelection(key=b"b")))

    assert report.replayed == 1
    with running_worker(queue, seen.append):
        assert wait_for(lambda: len(seen) == 1, timeout_s=60)
    # nothing else can arrive: the replay wrote one copy, and the queue topic is empty
    assert len(read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, at_least=1)) == 1
    assert read_topic(settings, queue.topic, PARTITIONS, timeout_s=3) == []
    (message,) = seen
    assert (message.key, message.value) == (b"b", b"value-b")
    headers = dict(message.headers)
    assert headers["trace"] == b"t-b"  # user headers kept
    assert headers[REPLAY_COUNT] == b"1"
    assert headers[ATTEMPT] == b"2"
    assert int(headers[DUE_MS] or b"0") <= time.time() * 1000
    assert DLQ_REASON not in headers
    assert message.topic == queue.queue.redelivery_topic


def test_replay_to_the_original_topic_starts_afresh_on_the_original_partition(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError"), ("c", "KeyError")])

    first = replay_dead_letters(queue, request(target="original"))
    again = replay_dead_letters(queue, request(target="original"))

    assert first.replayed == 3
    assert (again.scanned, again.replayed) == (0, 0)  # finished replays resume at the end
    copies = read_topic(settings, queue.topic, PARTITIONS, at_least=3)
    assert sorted(r.key() or b"" for r in copies) == [b"a", b"b", b"c"]
    for record in copies:
        headers = headers_of(record)
        assert headers[REPLAY_COUNT] == b"1"
        assert not {ATTEMPT, DUE_MS, DLQ_REASON} & set(headers)
        assert int(headers["kmq-original-partition"] or b"-1") == record.partition()


def test_dead_letters_at_the_replay_limit_are_skipped_and_counted(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    dead_letter(settings, queue, [("tired", "TimeoutError")], replayed=3)
    dead_letter(settings, queue, [("fresh", "TimeoutError")], replayed=2)

    report = replay_dead_letters(queue, request(max_replays=3))

    assert (report.selected, report.over_limit, report.replayed) == (2, 1, 1)
    (copy,) = read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, at_least=1)
    assert copy.key() == b"fresh"
    assert headers_of(copy)[REPLAY_COUNT] == b"3"


def test_offsets_and_time_range_select_exactly(settings: KmqSettings, queue: OpenedQueue) -> None:
    dead_letter(settings, queue, [(f"k{i}", "TimeoutError") for i in range(8)])  # 4 per partition
    selection = ReplaySelection(offsets={0: ((1, 2),), 1: ((3, 3),)})

    report = replay_dead_letters(queue, request(selection=selection))

    copies = read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, at_least=3)
    # partition 0 holds k0, k2, k4, k6; partition 1 holds k1, k3, k5, k7
    assert sorted(r.key() or b"" for r in copies) == [b"k2", b"k4", b"k7"]
    assert report.replayed == 3
    future = ReplaySelection(since=int(time.time() * 1000) + 60_000)
    assert replay_dead_letters(queue, request(selection=future)).selected == 0


def test_the_rate_limit_spreads_copies_out(settings: KmqSettings, queue: OpenedQueue) -> None:
    dead_letter(settings, queue, [(f"k{i}", "TimeoutError") for i in range(60)])

    started = time.monotonic()
    report = replay_dead_letters(queue, request(rate_per_s=40))
    elapsed_s = time.monotonic() - started

    assert report.replayed == 60
    assert elapsed_s >= 59 / 40 - 0.1  # a lower bound: it can never be faster


@pytest.mark.slow
def test_a_replay_killed_mid_way_resumes_where_it_was_done_and_duplicates_at_most_a_chunk(
    settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    # given 1,600 dead letters (8 s at 200/s): number i sits at DLQ partition i % 2, offset i // 2
    count = 1_600
    per_partition = count // PARTITIONS
    dead_letter(settings, queue, [(str(i), "TimeoutError") for i in range(count)])
    target = queue.queue.redelivery_topic
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    argv = kmq_argv("replay", "--topic", queue.topic, "--group", queue.group, "--rate", "200")
    log = (tmp_path / "replay-1.log").open("wb")
    first = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    watcher = assigned_reader(settings, target, dict.fromkeys(range(PARTITIONS), 0))
    try:
        # when it is killed once every partition is past its first chunk (a replay that started
        # over would repeat more than a chunk), in the middle of a chunk of copies
        copied = dict.fromkeys(range(PARTITIONS), 0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for record in watcher.consume(CHUNK, 0.01):
                copied[record.partition() or 0] += record.error() is None
            if min(copied.values()) > CHUNK + 10 and 20 <= sum(copied.values()) % CHUNK <= 70:
                break
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        watcher.close()
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    before = copies_by_partition(settings, target, timeout_s=2)
    assert sum(map(len, before.values())) < count, "the kill must land mid-way"

    # and run again to the end
    second = run_kmq("replay", "--topic", queue.topic, "--group", queue.group, env=env)

    assert second.returncode == 0, second.stderr
    after = copies_by_partition(settings, target, at_least=count, timeout_s=60)
    reported = int(second.stdout.rsplit("possible duplicates ", 1)[1].split(";")[0])
    replayed_again = int(second.stdout.split("replayed ", 1)[1].split(" ", 1)[0])
    duplicates = 0
    for partition in range(PARTITIONS):
        keys = [str(PARTITIONS * offset + partition).encode() for offset in range(per_partition)]
        copied_first = len(before[partition])
        first_run, second_run = after[partition][:copied_first], after[partition][copied_first:]
        # then the first run copied in order, and the second resumed at a position no more
        # than one chunk behind where the first stopped, and went on to the end
        assert first_run == keys[: len(first_run)]
        resumed_at = per_partition - len(second_run)
        assert second_run == keys[resumed_at:]
        assert 0 <= len(first_run) - resumed_at <= CHUNK, (partition, resumed_at)
        duplicates += len(first_run) - resumed_at
    copied_before = sum(map(len, before.values()))
    print(f"copied before the kill {copied_before}, duplicates {duplicates}, reported {reported}")
    assert min(copied.values()) > CHUNK + 10, "the first run was not killed past its first chunk"
    assert duplicates > 0, "the kill did not land in the middle of a chunk"
    assert duplicates <= reported <= CHUNK * PARTITIONS
    assert replayed_again == sum(map(len, after.values())) - copied_before


def copies_by_partition(
    settings: KmqSettings, topic: str, *, at_least: int = 0, timeout_s: float = 30
) -> dict[int, list[bytes | None]]:
    """Keys of ``topic``'s records per partition, in offset order."""
    records = read_topic(settings, topic, PARTITIONS, at_least=at_least, timeout_s=timeout_s)
    by_partition: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    for record in sorted(records, key=lambda r: (r.partition() or 0, r.offset() or 0)):
        by_partition[record.partition() or 0].append(record.key())
    return by_partition


def test_bad_replay_arguments_are_one_line_errors(
    settings: KmqSettings, queue: OpenedQueue
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    base = ("replay", "--topic", queue.topic, "--group", queue.group)
    cases = {
        ("--offsets", "0:x"): (
            1,
            "kmq: error: --offsets: offsets are PARTITION:FIRST[-LAST] items",
        ),
        ("--since", "1h", "--until", "2h"): (
            1,
            "kmq: error: --since/--until: the start of the time range must come before its end",
        ),
        ("--offsets", "7:1"): (
            1,
            f"kmq: error: --offsets: {queue.queue.dlq_topic} has 2 partitions",
        ),
        ("--since", "soonish"): (1, "kmq: error: --since: not a time: 'soonish'"),
        ("--retry-delays", "10s"): (
            2,
            "kmq: error: --retry-delays is part of the queue's definition, which `kmq provision`",
        ),
    }
    for extra, (code, message) in cases.items():
        result = run_kmq(*base, *extra, env=env)
        assert result.returncode == code, extra
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(message), result.stderr
    with pytest.raises(ConfigError, match="rate"):
        replay_dead_letters(queue, ReplayRequest(rate_per_s=float("nan")))


def test_a_replay_marks_its_dead_letters_in_the_audit_store_and_writes_its_action(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str
) -> None:
    dead_letter(
        settings, queue, [(f"t{i}", "TimeoutError") for i in range(3)] + [("v", "KeyError")]
    )
    store = AuditStore(private_audit_store)
    DlqIngester(queue, store).ingest_available()
    only_timeouts = ReplaySelection(error_type="TimeoutError")

    replay_dead_letters(
        queue, request(selection=only_timeouts, dry_run=True), audit=store, actor="ana"
    )
    replay_dead_letters(queue, request(selection=only_timeouts), audit=store, actor="ana")

    statuses = collections.Counter((d.error_type, d.status) for d in store.dead_letters())
    assert statuses == {("TimeoutError", "replayed"): 3, ("KeyError", "new"): 1}
    dry, real = store.actions(queue_topic=queue.topic)
    assert (dry.kind, dry.actor, dry.dry_run, dry.count) == ("replay", "ana", True, 3)
    assert (real.dry_run, real.count, real.target) == (
        False,
        3,
        queue.queue.redelivery_topic,
    )
    assert real.outcome.startswith("replayed 3 of 4 dead letters")
    assert "error type TimeoutError" in real.selection


def test_cli_replay_is_audited_under_its_actor(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError")])
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}

    result = run_kmq(
        "replay", "--topic", queue.topic, "--group", queue.group, "--actor", "oncall", env=env
    )

    assert result.returncode == 0, result.stderr
    (action,) = AuditStore(private_audit_store).actions(queue_topic=queue.topic)
    assert (action.actor, action.count, action.dry_run) == ("oncall", 1, False)


def test_discarded_dead_letters_are_skipped_by_replays_and_discards_are_audited(
    settings: KmqSettings, queue: OpenedQueue, private_audit_store: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError"), ("c", "KeyError")])
    store = AuditStore(private_audit_store)
    DlqIngester(queue, store).ingest_available()
    base = ("discard", "--topic", queue.topic, "--group", queue.group, "--error-type", "KeyError")

    dry = run_kmq(*base, "--dry-run", "--actor", "ana")
    real = run_kmq(*base, "--actor", "ana")
    report = replay_dead_letters(queue, request(), audit=store, actor="ana")

    assert (dry.stdout.strip(), real.stdout.strip()) == (
        "would discard 1 dead letter",
        "discarded 1 dead letter",
    )
    assert (report.replayed, report.discarded) == (2, 1)
    kinds = [(a.kind, a.dry_run, a.count) for a in store.actions(queue_topic=queue.topic)]
    assert kinds == [("discard", True, 1), ("discard", False, 1), ("replay", False, 2)]
    statuses = {d.key: d.status for d in store.dead_letters()}
    assert statuses == {b"a": "replayed", b"b": "replayed", b"c": "discarded"}
