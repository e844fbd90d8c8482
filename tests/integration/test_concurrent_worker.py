"""`kmq worker --concurrency N` on the embedded broker: key order checked call by call, and
nothing lost when a worker with calls in flight is SIGKILLed."""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kmq_dagster.settings import KmqSettings
from tests.integration.test_at_least_once import GROUP, Fleet
from tests.kafka_helpers import WaitBudget, new_queue, produce, read_topic, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def processes_for(settings: KmqSettings, topic: str, out_dir: Path, **env: str) -> Fleet:
    """The test's `kmq` processes (group ``GROUP``), every one stopped by PID at the end."""
    processes = Fleet(settings, topic, out_dir)
    processes.env.update(env)
    return processes


def produce_keyed(
    settings: KmqSettings, topic: str, count: int, *, keys: int, partitions: int
) -> None:
    """``count`` messages ``m-00000``...; message i has key ``k<i % keys>``, and each key one
    partition."""
    producer = Producer(settings.producer_config())
    for i in range(count):
        key = i % keys
        producer.produce(
            topic, key=f"k{key}".encode(), value=b"m-%05d" % i, partition=key % partitions
        )
    assert producer.flush(30) == 0


def key_order_violations(lines: list[str], topic: str) -> list[str]:
    """What the call log shows against key order: two calls of one key at once, a key's
    messages started out of offset order, a call on a copy from another topic."""
    problems: list[str] = []
    running: dict[str, str] = {}
    last_offset: dict[str, int] = {}
    for line in lines:
        kind, key, where, _value = line.split(" ")
        source, _, offset_text = where.rpartition(":")
        if kind == "start":
            if key in running:
                problems.append(f"{where} started while {running[key]} ran")
            running[key] = where
            if not source.startswith(f"{topic}:"):
                problems.append(f"{where} is a copy from another topic")
            offset = int(offset_text)
            if offset < last_offset.get(key, -1):
                problems.append(f"{where} started after offset {last_offset[key]}")
            last_offset[key] = offset
        elif kind == "end":
            running.pop(key, None)
    return problems


def calls_logged(out_dir: Path, pid: int | None = None) -> list[str]:
    """Lines of the keyed handler's call logs (of process ``pid``, or of every process)."""
    paths = out_dir.glob("keyed-*.log" if pid is None else f"keyed-{pid}.log")
    return [line for path in paths for line in path.read_text().splitlines()]


def count_of(kind: str, lines: list[str]) -> collections.Counter[str]:
    """How many ``kind`` lines (start, ok, end) each message value has."""
    return collections.Counter(line.split(" ")[3] for line in lines if line.startswith(kind + " "))


def test_key_ordered_worker_never_overlaps_a_key_and_starts_its_messages_in_offset_order(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 2,000 messages over 20 keys on 2 partitions, and a handler that fails ~10% of calls
    count = 2_000
    opened = new_queue(settings, topic_name, GROUP, partitions=2, retry_delays_ms=(200,) * 6)
    produce_keyed(settings, topic_name, count, keys=20, partitions=2)
    processes = processes_for(settings, topic_name, tmp_path)
    budget = WaitBudget(180)
    ids = {f"m-{i:05d}" for i in range(count)}

    def all_processed() -> bool:
        return ids <= set(count_of("ok", calls_logged(tmp_path)))

    # when one worker runs 8 calls at once in key order
    try:
        processes.start(
            "worker", "--handler", "tests.support.keyed_handler:handle",
            "--concurrency", "8", "--ordering", "key",
        )  # fmt: skip
        assert wait_for(all_processed, budget.left_s()), "not every message was processed"
    finally:
        processes.stop_all()

    # then no key ever ran twice at once, each key started in offset order, retries in place
    assert [p.returncode for p in processes.processes] == [0]  # SIGTERM: a clean stop
    lines = calls_logged(tmp_path)
    assert key_order_violations(lines, topic_name) == []
    starts = [line for line in lines if line.startswith("start ")]
    failures = len(starts) - sum(line.startswith("ok ") for line in lines)
    print(f"\nkey order: {len(starts)} calls, {failures} failed and retried in place")
    assert failures > 50  # failures happened, and were retried in place
    assert read_topic(settings, opened.queue.dlq_topic, 2, timeout_s=2) == []  # 7 attempts each


def test_a_sigkilled_concurrent_worker_loses_nothing(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 3,000 messages and a worker running 16 calls of 0-20 ms at once
    count = 3_000
    queue = new_queue(settings, topic_name, GROUP, partitions=2, visibility_timeout_ms=5_000)
    ids = [f"id-{i:05d}" for i in range(count)]
    processes = processes_for(
        settings, topic_name, tmp_path, KMQ_TEST_FAILURE_RATE="0", KMQ_TEST_MAX_WORK_S="0.02"
    )
    worker = ["worker", "--handler", "tests.support.keyed_handler:handle", "--concurrency", "16"]
    budget = WaitBudget(200)
    try:
        victim = processes.start(*worker, "--ordering", "unordered")
        produce(settings, topic_name, [i.encode() for i in ids], partitions=2)

        # when it is SIGKILLed with calls in flight, then a tracker and a second worker run
        def victim_busy() -> bool:
            return count_of("ok", calls_logged(tmp_path, victim.pid)).total() >= 250

        assert wait_for(victim_busy, budget.left_s(), interval_s=0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        victim_lines = calls_logged(tmp_path, victim.pid)
        in_flight = count_of("start", victim_lines) - count_of("end", victim_lines)
        processes.start("tracker")
        processes.start(*worker, "--ordering", "unordered")

        # then every message is processed at least once
        def all_processed() -> bool:
            return set(ids) <= set(count_of("ok", calls_logged(tmp_path)))

        assert wait_for(all_processed, budget.left_s()), "messages were lost"
    finally:
        processes.stop_all()

    processed = count_of("ok", calls_logged(tmp_path))
    duplicates = sum(n - 1 for n in processed.values() if n > 1)
    redelivered = read_topic(settings, queue.queue.redelivery_topic, 2, timeout_s=5)
    print(
        f"\nconcurrent kill: {in_flight.total()} calls in flight at the kill, {len(processed)} "
        f"processed, {duplicates} duplicates, {len(redelivered)} redelivered by the tracker"
    )
    assert in_flight.total() > 0, "no call was in flight when the worker was killed"
    assert set(processed) == set(ids)
    assert set(in_flight) <= set(processed)  # the calls the kill cut short were done again


def test_an_async_handler_at_concurrency_8_handles_every_message(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    new_queue(settings, topic_name, GROUP, partitions=2)
    produce(settings, topic_name, [str(i).encode() for i in range(300)], partitions=2)
    processes = processes_for(settings, topic_name, tmp_path)
    handled = tmp_path / "handled.txt"

    def all_handled() -> bool:
        return handled.exists() and len(handled.read_text().splitlines()) >= 300

    try:
        processes.start(
            "worker", "--handler", "tests.support.async_handlers:record",
            "--concurrency", "8", "--ordering", "unordered",
        )  # fmt: skip
        assert wait_for(all_handled, timeout_s=60)
    finally:
        processes.stop_all()

    assert [p.returncode for p in processes.processes] == [0]
    assert sorted(map(int, handled.read_text().split())) == list(range(300))
