"""A Spark task's concurrent calls over a chunk: at most N at once, in the chunk's ordering,
failures kept per message, the chunk done up to its first message that did not end."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator

import pytest

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.errors import ConfigError
from kmq_dagster.spark.concurrent_calls import ConcurrentCalls, check_concurrency, chunk_caller
from kmq_dagster.spark.message import SparkMessage
from kmq_dagster.spark.process import FAILED

#: A stop time far away (``time.monotonic()`` never reaches it in a test).
LATER = float("inf")


def chunk(keys: list[bytes | None], first_offset: int = 100) -> list[SparkMessage]:
    return [
        SparkMessage("orders", 1, first_offset + i, key, str(i).encode())
        for i, key in enumerate(keys)
    ]


class KeyChecker:
    """Records calls' starts and ends; a start of a key already running, or of a key's message
    before an earlier one of it, is a violation (messages without a key are each a key of their
    own). Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[bytes | int, int] = defaultdict(int)
        self.last_offset: dict[bytes | int, int] = {}
        self.in_flight = 0
        self.peak = 0
        self.violations: list[str] = []

    def start(self, message: SparkMessage) -> None:
        with self.lock:
            key = message.key if message.key is not None else message.offset
            if self.running[key]:
                self.violations.append(f"{key!r} at {message.offset} while running")
            if self.last_offset.get(key, -1) > message.offset:
                self.violations.append(f"{key!r} at {message.offset} after a later offset")
            self.running[key] += 1
            self.last_offset[key] = message.offset
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def end(self, message: SparkMessage) -> None:
        with self.lock:
            self.running[message.key if message.key is not None else message.offset] -= 1
            self.in_flight -= 1


@pytest.fixture
def checker() -> KeyChecker:
    return KeyChecker()


def calls_of(function: object, concurrency: int, ordering: Ordering) -> Iterator[ConcurrentCalls]:
    calls = ConcurrentCalls(function, concurrency, ordering)  # type: ignore[arg-type]
    try:
        yield calls
    finally:
        calls.close()


def run(function: object, messages: list[SparkMessage], n: int, ordering: Ordering) -> list[object]:
    for calls in calls_of(function, n, ordering):
        return calls(messages, LATER).results
    raise AssertionError("unreachable")


def test_async_calls_in_key_order_never_overlap_per_key_and_different_keys_run_together(
    checker: KeyChecker,
) -> None:
    # given three hot keys, a keyless message and one key of its own, interleaved
    keys: list[bytes | None] = [b"a", b"b", b"a", b"c", None, b"a", b"b", b"d", b"c", b"a"] * 5

    async def tracked(message: SparkMessage) -> int:
        checker.start(message)
        for _ in range(3):
            await asyncio.sleep(0)  # every other startable call starts meanwhile
        checker.end(message)
        return message.offset

    # when the chunk runs with room for eight calls
    results = run(tracked, chunk(keys), 8, Ordering.KEY)

    # then every message ran, no key twice at once and in offset order, keys side by side
    assert results == list(range(100, 150))
    assert checker.violations == []
    assert 1 < checker.peak <= 8


def test_sync_calls_in_key_order_never_overlap_per_key(checker: KeyChecker) -> None:
    keys: list[bytes | None] = [b"a", b"b", b"a", b"c", b"a", b"b"] * 10
    gate = threading.Event()

    def tracked(message: SparkMessage) -> int:
        checker.start(message)
        gate.wait(0.001)  # a moment for the other threads' calls to start
        checker.end(message)
        return message.offset

    results = run(tracked, chunk(keys), 4, Ordering.KEY)

    assert results == list(range(100, 160))
    assert checker.violations == []
    assert checker.peak <= 3  # three keys


@pytest.mark.parametrize("is_async", [False, True])
def test_unordered_calls_reach_n_at_once_and_never_more(
    checker: KeyChecker, is_async: bool
) -> None:
    # given a function whose calls wait until four of them run at once
    barrier = threading.Barrier(4, timeout=30)
    loop_barrier: list[asyncio.Event] = []

    def sync_call(message: SparkMessage) -> int:
        checker.start(message)
        barrier.wait()  # breaks (and fails the test) unless four calls run at once
        checker.end(message)
        return message.offset

    async def async_call(message: SparkMessage) -> int:
        checker.start(message)
        if not loop_barrier:
            loop_barrier.append(asyncio.Event())
        if checker.in_flight == 4:
            loop_barrier[0].set()
        await loop_barrier[0].wait()
        checker.end(message)
        if checker.in_flight == 0:
            loop_barrier.clear()
        return message.offset

    # when 40 messages of one key run unordered with room for four
    results = run(async_call if is_async else sync_call, chunk([b"k"] * 40), 4, Ordering.UNORDERED)

    # then all ran, four at a time
    assert results == list(range(100, 140))
    assert checker.peak == 4


def test_partition_order_runs_one_at_a_time_in_offset_order(checker: KeyChecker) -> None:
    async def tracked(message: SparkMessage) -> int:
        checker.start(message)
        await asyncio.sleep(0)
        checker.end(message)
        return message.offset

    results = run(tracked, chunk([b"a", b"b", None, b"c"] * 5), 8, Ordering.PARTITION)

    assert results == list(range(100, 120))
    assert checker.peak == 1


@pytest.mark.parametrize("ordering", list(Ordering))
def test_each_failure_is_kept_with_its_own_error_and_the_others_succeed(
    ordering: Ordering,
) -> None:
    async def every_third_fails(message: SparkMessage) -> str:
        await asyncio.sleep(0)
        if message.offset % 3 == 0:
            raise ValueError(f"bad {message.offset}")
        return f"ok {message.offset}"

    messages = chunk([b"a", b"b", None] * 6)
    for calls in calls_of(every_third_fails, 5, ordering):
        outcome = calls(messages, LATER)

    assert outcome.done == 18
    assert outcome.results == [
        FAILED if offset % 3 == 0 else f"ok {offset}" for offset in range(100, 118)
    ]
    assert [(m.offset, f.error_type, f.error_message) for m, f in outcome.failed] == [  # type: ignore[union-attr]
        (offset, "ValueError", f"bad {offset}") for offset in range(102, 118, 3)
    ]


def test_a_message_the_metadata_check_refuses_fails_without_a_call() -> None:
    called: list[int] = []

    def record(message: SparkMessage) -> int:
        called.append(message.offset)
        return message.offset

    messages = chunk([b"a", b"b", b"c", b"d"])
    for calls in calls_of(record, 4, Ordering.UNORDERED):
        outcome = calls(messages, LATER, lambda m: "corrupt" if m.offset == 101 else None)

    assert sorted(called) == [100, 102, 103]
    assert outcome.results == [100, FAILED, 102, 103]
    assert [(m.offset, why) for m, why in outcome.failed] == [(101, "corrupt")]


def test_when_time_is_up_the_started_calls_end_and_the_chunk_is_done_up_to_them() -> None:
    started: list[int] = []

    async def record(message: SparkMessage) -> int:
        started.append(message.offset)
        await asyncio.sleep(0)
        return message.offset

    # given a stop time already past: only what starts before the clock is read runs
    for calls in calls_of(record, 3, Ordering.KEY):
        outcome = calls(chunk([b"a", b"b", b"a", b"c", b"d"]), stop_at=0.0)

    # then the first three lanes' heads (offsets 100, 101, 103) ran; 102 waited for its key
    # and the chunk is done up to it: 103 is read again by the next batch
    assert sorted(started) == [100, 101, 103]
    assert outcome.results == [100, 101]


def test_an_async_function_is_awaited_even_at_concurrency_one() -> None:
    async def double(message: SparkMessage) -> int:
        await asyncio.sleep(0)
        return 2 * message.offset

    calls = chunk_caller(double, 1, Ordering.PARTITION)
    try:
        outcome = calls(chunk([b"a", b"b"]), LATER, None)
    finally:
        calls.close()

    assert outcome.results == [200, 202]


def test_a_sync_function_at_concurrency_one_keeps_the_sequential_path() -> None:
    assert not isinstance(chunk_caller(lambda m: m, 1, Ordering.KEY), ConcurrentCalls)
    assert not isinstance(chunk_caller(lambda m: m, 8, Ordering.PARTITION), ConcurrentCalls)
    assert isinstance(chunk_caller(lambda m: m, 8, Ordering.KEY), ConcurrentCalls)


def test_a_plain_function_returning_a_coroutine_has_it_awaited_and_a_generator_fails() -> None:
    async def later(value: int) -> int:
        return value

    def returns_coroutine(message: SparkMessage) -> object:
        if message.offset == 101:
            return (x for x in [1])
        return later(message.offset)

    for calls in calls_of(returns_coroutine, 2, Ordering.UNORDERED):
        outcome = calls(chunk([b"a", b"b"]), LATER)

    assert outcome.results == [100, FAILED]
    assert isinstance(outcome.failed[0][1], Failure)
    assert outcome.failed[0][1].error_type == "HandlerResultError"


@pytest.mark.parametrize(("concurrency", "ordering"), [(1, Ordering.PARTITION), (8, Ordering.KEY)])
def test_at_any_concurrency_a_returned_coroutine_is_awaited_and_a_returned_generator_fails(
    concurrency: int, ordering: Ordering
) -> None:
    # given a plain function (not async def, not a generator function) that returns a
    # coroutine for one message and a generator for the next: neither has done its work yet
    ran: list[int] = []

    async def work(offset: int) -> int:
        ran.append(offset)
        return offset

    def steps(offset: int) -> Iterator[int]:
        ran.append(offset)
        yield offset

    def deferred(message: SparkMessage) -> object:
        if message.offset == 101:
            return steps(message.offset)
        return work(message.offset)

    # when a chunk runs through the caller a Spark task uses
    calls = chunk_caller(deferred, concurrency, ordering)
    try:
        outcome = calls(chunk([b"a", b"b", b"c"]), LATER, None)
    finally:
        calls.close()

    # then the coroutines' work ran and their results are the outputs; the generator's
    # message failed (its retry or DLQ copy is written), never written as done
    assert sorted(ran) == [100, 102]
    assert outcome.results == [100, FAILED, 102]
    assert [(m.offset, f.error_type) for m, f in outcome.failed] == [(101, "HandlerResultError")]  # type: ignore[union-attr]


def test_concurrency_settings_are_checked_on_the_driver() -> None:
    def gen(message: SparkMessage) -> Iterator[int]:
        yield 1

    with pytest.raises(ConfigError, match="per-message functions only"):
        check_concurrency(4, "key", function=None, transform=True)
    with pytest.raises(ConfigError, match="per-message functions only"):
        check_concurrency(1, "unordered", function=None, transform=True)
    with pytest.raises(ConfigError, match="generator"):
        check_concurrency(4, "key", function=gen, transform=False)
    with pytest.raises(ConfigError, match="none of partition, key, unordered"):
        check_concurrency(4, "keys", function=lambda m: m, transform=False)
    with pytest.raises(ConfigError, match=r"^concurrency: 0 is not in \[1, 1024\]$"):
        check_concurrency(0, "key", function=lambda m: m, transform=False)
    with pytest.raises(ConfigError, match=r"^concurrency: 1025 is not in \[1, 1024\]$"):
        check_concurrency(1025, "key", function=lambda m: m, transform=False)
    assert check_concurrency(1, "partition", function=None, transform=True) is Ordering.PARTITION
    assert check_concurrency(8, "key", function=lambda m: m, transform=False) is Ordering.KEY
