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
from kmq_dagster.core.naming import dlq_topic, retry_topic
from kmq_dagster.core.replay import REPLAY_COUNT, ReplaySelection
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.dlq_ingest import DlqIngester
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import produce_dead_letters, read_topic, running_worker, wait_for
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

GROUP = "g"
DELAY_MS = 1_000
PARTITIONS = 2
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> str:
    provision_queue(
        settings,
        topic_name,
        partitions=PARTITIONS,
        group=GROUP,
        retry_delays_ms=(DELAY_MS,),
        delay_queue=False,
    )
    return topic_name


def dead_letter(
    settings: KmqSettings, topic: str, items: list[tuple[str, str]], *, replayed: int = 0
) -> None:
    produce_dead_letters(settings, topic, GROUP, items, partitions=PARTITIONS, replayed=replayed)


def request(topic: str, **options: object) -> ReplayRequest:
    return ReplayRequest(topic, GROUP, retry_delays_ms=(DELAY_MS,), **options)  # type: ignore[arg-type]


def headers_of(record: Message) -> dict[str, bytes | None]:
    return dict(normalize_headers(record.headers()))


def test_a_dry_run_lists_the_selection_and_moves_nothing(settings: KmqSettings, queue: str) -> None:
    dead_letter(settings, queue, [(f"t{i}", "TimeoutError") for i in range(5)])
    dead_letter(settings, queue, [(f"v{i}", "ValueError") for i in range(4)])
    only_timeouts = ReplaySelection(error_type="TimeoutError")

    dry = replay_dead_letters(settings, request(queue, selection=only_timeouts, dry_run=True))

    assert (dry.scanned, dry.selected, dry.replayed) == (9, 5, 0)
    assert len(dry.listed) == 5 and all("TimeoutError" in line for line in dry.listed)
    assert read_topic(settings, retry_topic(queue, GROUP, DELAY_MS), PARTITIONS, timeout_s=3) == []
    # a dry run records no progress: the real run still finds all five
    real = replay_dead_letters(settings, request(queue, selection=only_timeouts))
    assert (real.selected, real.replayed) == (5, 5)
    assert real.by_error_type == {"TimeoutError": 5}


def test_replayed_dead_letters_are_processed_again_by_their_group(
    settings: KmqSettings, queue: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError")])
    seen: list[KmqMessage] = []

    report = replay_dead_letters(settings, request(queue, selection=ReplaySelection(key=b"b")))

    assert report.replayed == 1
    with running_worker(settings, queue, GROUP, seen.append, RetryPolicy.fixed([DELAY_MS])):
        assert wait_for(lambda: len(seen) == 1, timeout_s=60)
        time.sleep(1)  # nothing else arrives
    (message,) = seen
    assert (message.key, message.value) == (b"b", b"value-b")
    headers = dict(message.headers)
    assert headers["trace"] == b"t-b"  # user headers kept
    assert headers[REPLAY_COUNT] == b"1"
    assert headers[ATTEMPT] == b"2"
    assert int(headers[DUE_MS] or b"0") <= time.time() * 1000
    assert DLQ_REASON not in headers
    assert message.topic == retry_topic(queue, GROUP, DELAY_MS)


def test_replay_to_the_original_topic_starts_afresh_on_the_original_partition(
    settings: KmqSettings, queue: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError"), ("c", "KeyError")])

    first = replay_dead_letters(settings, request(queue, target="original"))
    again = replay_dead_letters(settings, request(queue, target="original"))

    assert first.replayed == 3
    assert (again.scanned, again.replayed) == (0, 0)  # finished replays resume at the end
    copies = read_topic(settings, queue, PARTITIONS, at_least=3)
    assert sorted(r.key() or b"" for r in copies) == [b"a", b"b", b"c"]
    for record in copies:
        headers = headers_of(record)
        assert headers[REPLAY_COUNT] == b"1"
        assert not {ATTEMPT, DUE_MS, DLQ_REASON} & set(headers)
        assert int(headers["kmq-original-partition"] or b"-1") == record.partition()


def test_dead_letters_at_the_replay_limit_are_skipped_and_counted(
    settings: KmqSettings, queue: str
) -> None:
    dead_letter(settings, queue, [("tired", "TimeoutError")], replayed=3)
    dead_letter(settings, queue, [("fresh", "TimeoutError")], replayed=2)

    report = replay_dead_letters(settings, request(queue, max_replays=3))

    assert (report.selected, report.over_limit, report.replayed) == (2, 1, 1)
    (copy,) = read_topic(settings, retry_topic(queue, GROUP, DELAY_MS), PARTITIONS, at_least=1)
    assert copy.key() == b"fresh"
    assert headers_of(copy)[REPLAY_COUNT] == b"3"


def test_offsets_and_time_range_select_exactly(settings: KmqSettings, queue: str) -> None:
    dead_letter(settings, queue, [(f"k{i}", "TimeoutError") for i in range(8)])  # 4 per partition
    selection = ReplaySelection(offsets={0: ((1, 2),), 1: ((3, 3),)})

    report = replay_dead_letters(settings, request(queue, selection=selection))

    copies = read_topic(settings, retry_topic(queue, GROUP, DELAY_MS), PARTITIONS, at_least=3)
    # partition 0 holds k0, k2, k4, k6; partition 1 holds k1, k3, k5, k7
    assert sorted(r.key() or b"" for r in copies) == [b"k2", b"k4", b"k7"]
    assert report.replayed == 3
    future = ReplaySelection(since_ms=int(time.time() * 1000) + 60_000)
    assert replay_dead_letters(settings, request(queue, selection=future)).selected == 0


def test_the_rate_limit_spreads_copies_out(settings: KmqSettings, queue: str) -> None:
    dead_letter(settings, queue, [(f"k{i}", "TimeoutError") for i in range(60)])

    started = time.monotonic()
    report = replay_dead_letters(settings, request(queue, rate_per_s=40))
    elapsed_s = time.monotonic() - started

    assert report.replayed == 60
    assert elapsed_s >= 59 / 40 - 0.1  # a lower bound: it can never be faster


@pytest.mark.slow
def test_a_replay_killed_mid_way_resumes_without_losing_any_and_counts_duplicates(
    settings: KmqSettings, queue: str, tmp_path: Path
) -> None:
    count = 600
    dead_letter(settings, queue, [(str(i), "TimeoutError") for i in range(count)])
    env = {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_RETRY_DELAYS": "1s",
    }
    argv = kmq_argv("replay", "--topic", queue, "--group", GROUP, "--rate", "200")
    log = (tmp_path / "replay-1.log").open("wb")
    first = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        target = retry_topic(queue, GROUP, DELAY_MS)
        assert wait_for(lambda: len(read_topic(settings, target, PARTITIONS, timeout_s=1)) > 150)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    before = len(read_topic(settings, target, PARTITIONS, timeout_s=2))
    assert before < count, "the kill must land mid-way"

    second = run_kmq("replay", "--topic", queue, "--group", GROUP, env=env)

    assert second.returncode == 0, second.stderr
    copies = read_topic(settings, target, PARTITIONS, at_least=count, timeout_s=60)
    seen = collections.Counter(r.key() for r in copies)
    duplicates = sum(n - 1 for n in seen.values())
    reported = int(second.stdout.rsplit("possible duplicates ", 1)[1].split(";")[0])
    print(f"replayed before the kill {before}, duplicates {duplicates}, reported {reported}")
    assert len(seen) == count, "a dead letter was never replayed"
    assert duplicates <= reported
    assert "replayed" in second.stdout


def test_bad_replay_arguments_are_one_line_errors(settings: KmqSettings, queue: str) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_RETRY_DELAYS": "1s"}
    base = ("replay", "--topic", queue, "--group", GROUP)
    cases = {
        ("--offsets", "0:x"): "kmq: error: --offsets takes PARTITION:FIRST[-LAST] items",
        ("--since", "1h", "--until", "2h"): "kmq: error: --since must be before --until",
        ("--offsets", "7:1"): f"kmq: error: {dlq_topic(queue, GROUP)} has 2 partitions",
        ("--since", "soonish"): "kmq: error: not a time: 'soonish'",
    }
    for extra, message in cases.items():
        result = run_kmq(*base, *extra, env=env)
        assert result.returncode == 1, extra
        assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    wrong_delays = run_kmq(*base, "--retry-delays", "10s", env=env)
    assert "or give replay the group's --retry-delays" in wrong_delays.stderr
    with pytest.raises(ConfigError, match="retry delays"):
        replay_dead_letters(settings, ReplayRequest(queue, GROUP))


def test_a_replay_marks_its_dead_letters_in_the_audit_store_and_writes_its_action(
    settings: KmqSettings, queue: str, private_audit_store: str
) -> None:
    dead_letter(
        settings, queue, [(f"t{i}", "TimeoutError") for i in range(3)] + [("v", "KeyError")]
    )
    store = AuditStore(private_audit_store)
    DlqIngester(settings, store, queue, GROUP).ingest_available()
    only_timeouts = ReplaySelection(error_type="TimeoutError")

    replay_dead_letters(
        settings, request(queue, selection=only_timeouts, dry_run=True), audit=store, actor="ana"
    )
    replay_dead_letters(settings, request(queue, selection=only_timeouts), audit=store, actor="ana")

    statuses = collections.Counter((d.error_type, d.status) for d in store.dead_letters())
    assert statuses == {("TimeoutError", "replayed"): 3, ("KeyError", "new"): 1}
    dry, real = store.actions(queue_topic=queue)
    assert (dry.kind, dry.actor, dry.dry_run, dry.count) == ("replay", "ana", True, 3)
    assert (real.dry_run, real.count, real.target) == (
        False,
        3,
        retry_topic(queue, GROUP, DELAY_MS),
    )
    assert real.outcome.startswith("replayed 3 of 4 dead letters")
    assert "error type TimeoutError" in real.selection


def test_cli_replay_is_audited_under_its_actor(
    settings: KmqSettings, queue: str, private_audit_store: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError")])
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_RETRY_DELAYS": "1s"}

    result = run_kmq("replay", "--topic", queue, "--group", GROUP, "--actor", "oncall", env=env)

    assert result.returncode == 0, result.stderr
    (action,) = AuditStore(private_audit_store).actions(queue_topic=queue)
    assert (action.actor, action.count, action.dry_run) == ("oncall", 1, False)


def test_discarded_dead_letters_are_skipped_by_replays_and_discards_are_audited(
    settings: KmqSettings, queue: str, private_audit_store: str
) -> None:
    dead_letter(settings, queue, [("a", "TimeoutError"), ("b", "TimeoutError"), ("c", "KeyError")])
    store = AuditStore(private_audit_store)
    DlqIngester(settings, store, queue, GROUP).ingest_available()
    base = ("discard", "--topic", queue, "--group", GROUP, "--error-type", "KeyError")

    dry = run_kmq(*base, "--dry-run", "--actor", "ana")
    real = run_kmq(*base, "--actor", "ana")
    report = replay_dead_letters(settings, request(queue), audit=store, actor="ana")

    assert (dry.stdout.strip(), real.stdout.strip()) == (
        "would discard 1 dead letters",
        "discarded 1 dead letters",
    )
    assert (report.replayed, report.discarded) == (2, 1)
    kinds = [(a.kind, a.dry_run, a.count) for a in store.actions(queue_topic=queue)]
    assert kinds == [("discard", True, 1), ("discard", False, 1), ("replay", False, 2)]
    statuses = {d.key: d.status for d in store.dead_letters()}
    assert statuses == {b"a": "replayed", b"b": "replayed", b"c": "discarded"}
