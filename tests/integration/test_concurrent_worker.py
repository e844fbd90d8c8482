"""`kmq worker --concurrency N` on the embedded broker: key order checked call by call; nothing
lost when a worker with calls in flight is SIGKILLed, stopped (SIGTERM, Ctrl-C) or loses
partitions to a second worker; its metrics scraped while calls are in flight."""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kmq_dagster.broker.ports import free_port
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from tests.faults.test_metrics import scrape, value
from tests.integration.test_at_least_once import Fleet
from tests.integration.test_spark_breaker import committed_total
from tests.kafka_helpers import (
    WaitBudget,
    group_of,
    new_queue,
    produce,
    read_topic,
    running_service,
    wait_for,
)
from tests.processes import stacks_in_log
from tests.support.gated_handler import gate_of

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def processes_for(settings: KmqSettings, topic: str, out_dir: Path, **env: str) -> Fleet:
    """The test's `kmq` processes (its own group), every one stopped by PID at the end."""
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
    # A line a SIGKILLed worker was writing may be torn: only whole lines count.
    fields = (line.split(" ") for line in lines if line.startswith(kind + " "))
    return collections.Counter(parts[3] for parts in fields if len(parts) > 3)


GATED = ("worker", "--handler", "tests.support.gated_handler:handle")


def gated_lines(out_dir: Path, pid: int | None = None) -> list[str]:
    """Lines of the gated handler's call logs (of process ``pid``, or of every process)."""
    paths = out_dir.glob("gated-*.log" if pid is None else f"gated-{pid}.log")
    return [line for path in paths for line in path.read_text().splitlines()]


def gated(kind: str, lines: list[str]) -> collections.Counter[str]:
    """How many ``kind`` lines (start, ok) each message value has."""
    return collections.Counter(line.split(" ")[1] for line in lines if line.startswith(kind + " "))


def partitions_started(lines: list[str]) -> set[str]:
    """``topic:partition`` of every call started."""
    return {line.split(" ")[2] for line in lines if line.startswith("start ")}


def test_key_ordered_worker_never_overlaps_a_key_and_starts_its_messages_in_offset_order(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 2,000 messages over 20 keys on 2 partitions, and a handler that fails ~10% of calls
    count = 2_000
    opened = new_queue(
        settings, topic_name, group_of(topic_name), partitions=2, retry_delays_ms=(200,) * 6
    )
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


@pytest.mark.parametrize("ordering", ["unordered", "key"])
def test_a_sigkilled_concurrent_worker_loses_nothing(
    settings: KmqSettings, topic_name: str, tmp_path: Path, ordering: str
) -> None:
    # given 3,000 messages and a worker running 16 calls of 0-20 ms at once (in key order on
    # 16 keys: a key's messages fetched while its run goes join that run)
    count = 3_000
    queue = new_queue(
        settings, topic_name, group_of(topic_name), partitions=2, visibility_timeout_ms=5_000
    )
    ids = [f"m-{i:05d}" for i in range(count)]
    processes = processes_for(
        settings, topic_name, tmp_path, KMQ_TEST_FAILURE_RATE="0", KMQ_TEST_MAX_WORK_S="0.02"
    )
    worker = ["worker", "--handler", "tests.support.keyed_handler:handle", "--concurrency", "16"]
    budget = WaitBudget(200)
    try:
        victim = processes.start(*worker, "--ordering", ordering)
        if ordering == "key":
            produce_keyed(settings, topic_name, count, keys=16, partitions=2)
        else:
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
        processes.start(*worker, "--ordering", ordering)

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


def test_a_worker_sigkilled_with_100_calls_in_flight_loses_none_of_them(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 300 messages and a worker at --concurrency 100 whose calls all wait at a gate
    queue = new_queue(
        settings, topic_name, group_of(topic_name), partitions=2, visibility_timeout_ms=3_000
    )
    ids = {f"held-{i:03d}" for i in range(300)}
    gate_of(tmp_path, "held").touch()
    produce(settings, topic_name, [v.encode() for v in sorted(ids)], partitions=2)
    processes = processes_for(settings, topic_name, tmp_path)
    worker = [*GATED, "--concurrency", "100", "--ordering", "unordered"]
    budget = WaitBudget(200)
    try:
        victim = processes.start(*worker)
        assert wait_for(
            lambda: len(gated("start", gated_lines(tmp_path, victim.pid))) == 100,
            budget.left_s(),
        ), "the worker never had 100 calls in flight"
        # and its group committed every offset it fetched: only the markers can bring them back
        assert wait_for(
            lambda: committed_total(settings, topic_name, group_of(topic_name)) == 300,
            budget.left_s(),
        )

        # when it is SIGKILLed with those 100 calls in flight, and the gate then opens for a
        # tracker and a second worker
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        in_flight = set(gated("start", gated_lines(tmp_path, victim.pid)))
        gate_of(tmp_path, "held").unlink()
        with running_service(RedeliveryTracker(queue)) as tracker:
            processes.start(*worker)
            assert wait_for(
                lambda: ids <= set(gated("ok", gated_lines(tmp_path))), budget.left_s()
            ), "messages were lost"
            assert wait_for(lambda: tracker.inflight_count() == 0, budget.left_s())
    finally:
        processes.stop_all()

    # then none was lost: the 100 cut short were handled again, duplicates counted
    done = gated("ok", gated_lines(tmp_path))
    duplicates = sum(n - 1 for n in done.values() if n > 1)
    print(f"\nkill at 100 in flight: {len(done)} handled, {duplicates} handled twice")
    assert len(in_flight) == 100 and in_flight <= set(done)
    assert set(done) == ids


def test_an_async_handler_at_concurrency_8_handles_every_message(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    new_queue(settings, topic_name, group_of(topic_name), partitions=2)
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


def test_the_metrics_endpoint_shows_calls_in_flight_held_messages_and_waits_by_ordering(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 16 messages over 8 keys whose calls wait at a closed gate
    new_queue(settings, topic_name, group_of(topic_name))
    gate = gate_of(tmp_path, "hold")
    gate.touch()
    producer = Producer(settings.producer_config())
    for i in range(16):
        producer.produce(topic_name, key=b"k%d" % (i % 8), value=b"hold-%02d" % i)
    assert producer.flush(30) == 0
    processes = processes_for(settings, topic_name, tmp_path)
    port = free_port()
    labels = {"topic": topic_name, "group": group_of(topic_name), "service": "worker"}
    budget = WaitBudget(120)

    def figures(**expected: float) -> bool:
        samples = scrape(port)
        return all(value(samples, name, **labels) == v for name, v in expected.items())

    try:
        # when a worker runs 8 calls at once in key order: one per key runs, the other 8 wait
        processes.start(*GATED, "--concurrency", "8", "--ordering", "key",
                        "--metrics-port", str(port))  # fmt: skip
        assert wait_for(
            lambda: figures(kmq_calls_in_flight=8, kmq_held_messages=8), budget.left_s()
        ), scrape(port)
        during = scrape(port)
        gate.unlink()
        assert wait_for(
            lambda: figures(kmq_processed_total=16, kmq_calls_in_flight=0, kmq_held_messages=0),
            budget.left_s(),
        ), scrape(port)
        after = scrape(port)
    finally:
        processes.stop_all()

    # then the waits from fetch to start were counted by ordering: 8 while the gate was closed
    assert value(during, "kmq_call_wait_seconds_count", ordering="key", **labels) == 8
    assert value(after, "kmq_call_wait_seconds_count", ordering="key", **labels) == 16
    waited_s = value(after, "kmq_call_wait_seconds_sum", ordering="key", **labels) or 0.0
    assert waited_s > 0  # the second message of each key waited for the first
    assert value(after, "kmq_call_wait_seconds_bucket", ordering="key", le="+Inf") == 16


#: The stopped worker's drain: it must outlast this test noticing the drain began and opening
#: the gate, and the 8 calls then ending and being acknowledged (4 s did not on a loaded
#: machine); the 8 other calls are cut off only when it has passed.
DRAIN_TIMEOUT_S = 30

#: The two ways an operator stops a worker, and the exit code each must give.
each_stop_signal = pytest.mark.parametrize(
    ("stop_signal", "exit_code"),
    [(signal.SIGTERM, 0), (signal.SIGINT, 130)],
    ids=["SIGTERM exits 0", "Ctrl-C exits 130"],
)


@each_stop_signal
def test_a_stopped_worker_acks_the_calls_that_end_within_the_drain_timeout_and_leaves_the_rest(
    settings: KmqSettings,
    topic_name: str,
    tmp_path: Path,
    stop_signal: signal.Signals,
    exit_code: int,
) -> None:
    # given a worker with 16 calls in flight: 8 will end while it drains, 8 will not
    queue = new_queue(
        settings, topic_name, group_of(topic_name), partitions=2, visibility_timeout_ms=3_000
    )
    ending = {f"ends-{i}" for i in range(8)}
    cut = {f"cut-{i}" for i in range(8)}
    for name in ("ends", "cut"):
        gate_of(tmp_path, name).touch()
    produce(settings, topic_name, [v.encode() for v in sorted(ending | cut)], partitions=2)
    processes = processes_for(settings, topic_name, tmp_path)
    budget = WaitBudget(150)
    worker = [*GATED, "--concurrency", "16", "--ordering", "unordered"]
    try:
        first = processes.start(*worker, "--drain-timeout", str(DRAIN_TIMEOUT_S))
        assert wait_for(
            lambda: len(gated("start", gated_lines(tmp_path, first.pid))) == 16, budget.left_s()
        )

        # when it is stopped, and then, while it drains, 8 of its calls end (8 outlast it)
        first.send_signal(stop_signal)
        log = tmp_path / "worker-0.log"
        draining = f"stopping: waiting up to {DRAIN_TIMEOUT_S} s for 16 calls"
        assert wait_for(lambda: draining in log.read_text(), budget.left_s())
        gate_of(tmp_path, "ends").unlink()
        first.wait(timeout=budget.left_s())
        first_lines = gated_lines(tmp_path, first.pid)
        # and a tracker and a second worker (whose calls all end) run after it
        gate_of(tmp_path, "cut").unlink()
        with running_service(RedeliveryTracker(queue)) as tracker:
            second = processes.start(*worker)
            assert wait_for(
                lambda: cut <= set(gated("ok", gated_lines(tmp_path, second.pid))),
                budget.left_s(),
            ), "the calls cut off were not redelivered"
            assert wait_for(lambda: tracker.inflight_count() == 0, budget.left_s())
    finally:
        processes.stop_all()

    # then it exited with the signal's code, having acknowledged what ended in the drain:
    # only the calls it cut off were redelivered, and nothing ran twice
    assert first.returncode == exit_code
    assert set(gated("ok", first_lines)) == ending
    redelivered = read_topic(settings, queue.queue.redelivery_topic, 2, timeout_s=5)
    assert {(r.value() or b"").decode() for r in redelivered} == cut
    assert set(gated("start", gated_lines(tmp_path, second.pid))) == cut


@each_stop_signal
def test_a_serial_worker_whose_call_hangs_exits_after_the_drain_timeout(
    settings: KmqSettings,
    topic_name: str,
    tmp_path: Path,
    stop_signal: signal.Signals,
    exit_code: int,
) -> None:
    # given a worker at concurrency 1 whose call hangs (its gate stays closed)
    queue = new_queue(settings, topic_name, group_of(topic_name), visibility_timeout_ms=3_000)
    gate_of(tmp_path, "hung").touch()
    produce(settings, topic_name, [b"hung-1"])
    processes = processes_for(settings, topic_name, tmp_path)
    budget = WaitBudget(150)
    try:
        first = processes.start(*GATED, "--drain-timeout", "2")
        assert wait_for(lambda: gated("start", gated_lines(tmp_path, first.pid)), budget.left_s())
        # (kill -USR1 shows where it hangs, down to the worker's main thread, and it goes on)
        stacks = stacks_in_log(first, processes.logs[first.pid])
        assert "gated_handler.py" in stacks, stacks
        assert stacks.count("_run_module_as_main") == 2, stacks  # the supervisor's, the worker's
        assert first.poll() is None

        # when it is asked to stop, twice, with the call still hanging
        first.send_signal(stop_signal)
        first.send_signal(stop_signal)
        first.wait(timeout=budget.left_s())
        log = (tmp_path / "worker-0.log").read_text()

        # and then the call can end: a tracker and a second worker run
        gate_of(tmp_path, "hung").unlink()
        with running_service(RedeliveryTracker(queue)):
            second = processes.start(*GATED)
            assert wait_for(
                lambda: gated("ok", gated_lines(tmp_path, second.pid)), budget.left_s()
            ), "the message of the hung call was not redelivered"
    finally:
        processes.stop_all()

    # then it exited with the stop's code, said why in one line, and the message was not lost
    assert first.returncode == exit_code, log[-2000:]
    assert log.count("still running 2 s after the stop request (--drain-timeout)") == 1, log
    assert not gated("ok", gated_lines(tmp_path, first.pid))
    assert set(gated("ok", gated_lines(tmp_path, second.pid))) == {"hung-1"}


#: A handler whose call never comes back to Python (C code holding the GIL).
GIL_HOLDING = ("worker", "--handler", "tests.support.gil_holding_handler:handle")


@each_stop_signal
def test_a_worker_whose_call_holds_the_gil_is_killed_at_the_supervisors_stop_deadline(
    settings: KmqSettings,
    topic_name: str,
    tmp_path: Path,
    stop_signal: signal.Signals,
    exit_code: int,
) -> None:
    # given a worker whose call runs C code that holds the GIL: no Python runs in its process,
    # neither the signal handler that stops it nor its --drain-timeout's thread
    queue = new_queue(settings, topic_name, group_of(topic_name), visibility_timeout_ms=3_000)
    produce(settings, topic_name, [b"stuck-1"])
    # the supervisor waits the drain timeout plus this grace after the stop request
    processes = processes_for(settings, topic_name, tmp_path, KMQ_CRASH_GUARD_STOP_GRACE_S="3")
    budget = WaitBudget(150)
    try:
        first = processes.start(*GIL_HOLDING, "--drain-timeout", "1")
        assert wait_for(lambda: gated("start", gated_lines(tmp_path, first.pid)), budget.left_s())

        # when it is asked to stop
        first.send_signal(stop_signal)
        first.wait(timeout=budget.left_s())
        log = (tmp_path / "worker-0.log").read_text()

        # and a tracker runs after it
        with running_service(RedeliveryTracker(queue)):
            redelivered = read_topic(
                settings, queue.queue.redelivery_topic, 1, at_least=1, timeout_s=budget.left_s()
            )
    finally:
        processes.stop_all()

    # then the supervisor killed it at 1 + 3 s, said so in one line and exited with the stop's
    # code, and the message it had not acknowledged was redelivered, not lost
    assert first.returncode == exit_code, log[-2000:]
    assert log.count("still running 4 s after the stop request: killed") == 1, log[-2000:]
    assert [r.value() for r in redelivered] == [b"stuck-1"]


def test_a_rebalance_while_calls_are_in_flight_loses_nothing(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given a worker holding 40 messages of 4 partitions: 8 calls in flight at a closed gate
    count = 400
    new_queue(settings, topic_name, group_of(topic_name), partitions=4, visibility_timeout_ms=5_000)
    ids = [f"m-{i:04d}" for i in range(count)]
    gate = gate_of(tmp_path, "m")
    gate.touch()
    produce(settings, topic_name, [i.encode() for i in ids[:40]], partitions=4)
    processes = processes_for(settings, topic_name, tmp_path)
    port = free_port()
    worker = [*GATED, "--concurrency", "8", "--ordering", "unordered"]
    budget = WaitBudget(200)
    try:
        first = processes.start(*worker, "--metrics-port", str(port))
        assert wait_for(
            lambda: (
                value(scrape(port), "kmq_calls_in_flight") == 8
                and value(scrape(port), "kmq_held_messages") == 32
            ),
            budget.left_s(),
        ), scrape(port)

        # when a second worker joins (partitions move to it) and the rest is produced
        second = processes.start(*worker)
        produce(settings, topic_name, [i.encode() for i in ids[40:]], partitions=4)
        assert wait_for(lambda: gated_lines(tmp_path, second.pid), budget.left_s()), (
            "the second worker got no partition"
        )
        gate.unlink()
        processes.start("tracker")

        # then every message is handled at least once
        def all_handled() -> bool:
            return set(ids) <= set(gated("ok", gated_lines(tmp_path)))

        assert wait_for(all_handled, budget.left_s()), "messages were lost"
    finally:
        processes.stop_all()

    handled = gated("ok", gated_lines(tmp_path))
    duplicates = sum(n - 1 for n in handled.values() if n > 1)
    first_lines = gated_lines(tmp_path, first.pid)
    moved = partitions_started(first_lines) & partitions_started(gated_lines(tmp_path, second.pid))
    print(
        f"\nrebalance: partitions moved {sorted(moved)}, {len(handled)} handled, "
        f"{duplicates} duplicates, {len(gated('ok', first_lines))} by the first worker"
    )
    assert set(handled) == set(ids)
    assert moved, "no partition the first worker held messages of moved to the second"
