"""The concurrent worker loop on in-memory fakes: the in-flight limit, key order through
failures, retry routing, back-pressure, visibility, draining, async handlers. Fake clock for
due times; real threads run the calls."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.breaker import State
from kmq_dagster.core.headers import DLQ_REASON, ERROR_MESSAGE, ERROR_TYPE
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.retry_headers import ATTEMPT, FIRST_FAILURE_MS
from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.opened_queue import vouch_for
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import ORDERING_WAIT_MS
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import ThreadRunner
from kmq_dagster.worker.loop import WorkerLoop
from tests.kafka_helpers import wait_for
from tests.unit.fakes import FakeClock, FakeConsumer, FakeProducer, message
from tests.unit.test_worker_loop import (
    QUEUE,
    RETRY_TOPIC,
    Outage,
    Unprintable,
    shared_breaker,
    state_of,
)


def loop_for(
    batches: list[list[KmqMessage]],
    handler: Callable[[KmqMessage], object],
    *,
    producer: FakeProducer | None = None,
    concurrency: int = 4,
    ordering: Ordering = Ordering.UNORDERED,
    max_buffered: int | None = None,
    clock: FakeClock | None = None,
    breaker: SharedBreaker | None = None,
    extend_running: bool = True,
) -> tuple[WorkerLoop, FakeConsumer, FakeProducer]:
    clock = clock or FakeClock()
    producer = producer or FakeProducer()
    policy = QUEUE.retry_policy.with_non_retryable(["KeyError"])
    opened = vouch_for(KmqSettings(), QUEUE.replace(retry_policy=policy))
    router = RetryRouter(
        opened, clock_ms=clock, rng=random.Random(1), producer=producer,  # type: ignore[arg-type]
    )  # fmt: skip
    consumer = FakeConsumer(batches, visibility_timeout_ms=9_000)
    loop = WorkerLoop(
        consumer,
        HandlerCall(handler),
        threading.Event(),
        router=router,
        breaker=breaker,
        clock_ms=clock,
        concurrency=concurrency,
        ordering=ordering,
        max_buffered=max_buffered,
        extend_running=extend_running,
        rng=random.Random(1),
    )
    return loop, consumer, producer


def step_until(loop: WorkerLoop, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        loop.step()


def _waits_once_released_after_2_s(
    loop: WorkerLoop, consumer: FakeConsumer, clock: FakeClock, release: threading.Event, count: int
) -> WaitHistogram:
    """Move the clock on 2 s, release the blocked calls, run until ``count`` are acknowledged
    and drain: the waits observed."""
    clock.advance(2_000)
    release.set()
    step_until(loop, lambda: len(consumer.acked) == count)
    loop.drain(1.0)
    waits = loop.stats.waits
    assert waits is not None
    return waits


class Calls:
    """A handler that records each call's (key, offset, start, end) and the most at once."""

    def __init__(self, sleep_s: float = 0.01, fail_first: set[int] | None = None) -> None:
        self.sleep_s = sleep_s
        self.fail_first = fail_first or set()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls: list[tuple[bytes | None, int, float, float]] = []

    def __call__(self, msg: KmqMessage) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        start = time.monotonic()
        time.sleep(self.sleep_s)
        end = time.monotonic()
        with self.lock:
            self.running -= 1
            self.calls.append((msg.key, msg.offset, start, end))
            if msg.offset in self.fail_first:
                self.fail_first.discard(msg.offset)
                raise Outage(f"offset {msg.offset} failed")


def keyed(count: int, keys: list[bytes]) -> list[KmqMessage]:
    return [message("orders", i, b"v%d" % i, _key=keys[i % len(keys)]) for i in range(count)]


def test_never_more_calls_at_once_than_the_concurrency_and_all_are_acked() -> None:
    calls = Calls(sleep_s=0.01)
    loop, consumer, _ = loop_for([keyed(40, [b"a"])], calls, concurrency=4)

    step_until(loop, lambda: len(consumer.acked) == 40)

    assert 1 < calls.most <= 4  # calls overlap, never more than four
    loop.drain(1.0)


def test_key_order_never_overlaps_one_key_but_overlaps_two_keys() -> None:
    calls = Calls(sleep_s=0.01)
    loop, consumer, _ = loop_for([keyed(30, [b"a", b"b"])], calls, ordering=Ordering.KEY)

    step_until(loop, lambda: len(consumer.acked) == 30)
    loop.drain(1.0)

    for key in (b"a", b"b"):
        mine = sorted((c for c in calls.calls if c[0] == key), key=lambda c: c[2])
        assert [c[1] for c in mine] == sorted(c[1] for c in mine)  # started in offset order
        assert all(prev[3] <= nxt[2] for prev, nxt in itertools.pairwise(mine))
    assert calls.most == 2  # one call per key, two keys at once


def test_a_key_ordered_failure_holds_the_keys_later_messages_until_its_retry_succeeds() -> None:
    clock = FakeClock()
    calls = Calls(sleep_s=0.0, fail_first={0})
    batch = [
        message("orders", 0, b"a0", _key=b"a"),
        message("orders", 1, b"a1", _key=b"a"),
        message("orders", 2, b"b2", _key=b"b"),
    ]
    loop, consumer, producer = loop_for([batch], calls, ordering=Ordering.KEY, clock=clock)

    step_until(loop, lambda: len(calls.calls) == 2 and loop.scheduler.in_flight == 0)
    for _ in range(5):
        loop.step()
    assert sorted(c[1] for c in calls.calls) == [0, 2]  # a1 waits behind a0's retry
    assert [m.offset for m in consumer.acked] == [2]

    clock.advance(5_000)  # the policy's delay (with jitter) for the first retry
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)

    assert [c[1] for c in calls.calls[2:]] == [0, 1]  # a0 again, then a1
    assert producer.delivered == []  # retried in place, not through a retry topic


def test_a_key_ordered_message_goes_to_the_dlq_with_its_reason_when_retries_are_spent() -> None:
    clock = FakeClock()
    always = Outage("down")

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            raise always

    batch = [message("orders", 0, b"a0", _key=b"a"), message("orders", 1, b"a1", _key=b"a")]
    loop, consumer, producer = loop_for([batch], handler, ordering=Ordering.KEY, clock=clock)

    step_until(loop, lambda: loop.scheduler.next_due_ms() is not None)
    clock.advance(10_000)
    step_until(loop, lambda: len(consumer.acked) == 2)
    loop.drain(1.0)

    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.value == b"a0"
    assert b"failed 2 attempts" in (dead.header(DLQ_REASON) or b"")
    assert [m.offset for m in consumer.acked] == [0, 1]  # a0 once its copy was durable


#: Retry headers no worker could have written: an attempt that is not a number.
CORRUPT = [(ATTEMPT, b"\xff")]


def test_corrupt_retry_metadata_in_a_key_run_goes_to_the_dlq_in_its_turn() -> None:
    called: list[int] = []
    batch = [
        message("orders", 0, b"a0", _key=b"a"),
        message("orders", 1, b"a1", _key=b"a", _headers=CORRUPT),
        message("orders", 2, b"a2", _key=b"a"),
    ]
    loop, consumer, producer = loop_for(
        [batch], lambda m: called.append(m.offset), ordering=Ordering.KEY
    )

    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)

    assert called == [0, 2]  # never called on a1; a2 waited for a1's copy
    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.value == b"a1"
    assert (dead.header(DLQ_REASON) or b"").startswith(b"corrupt retry metadata")
    assert [m.offset for m in consumer.acked] == [0, 1, 2]


def test_corrupt_retry_metadata_unordered_goes_to_the_dlq_and_the_rest_runs() -> None:
    called: list[int] = []
    batch = [message("orders", i, b"v%d" % i, _headers=CORRUPT if i == 1 else []) for i in range(4)]
    loop, consumer, producer = loop_for([batch], lambda m: called.append(m.offset))

    step_until(loop, lambda: len(consumer.acked) == 4)
    loop.drain(1.0)

    assert sorted(called) == [0, 2, 3]  # never called on 1
    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.value == b"v1"
    assert (dead.header(DLQ_REASON) or b"").startswith(b"corrupt retry metadata")
    assert sorted(m.offset for m in consumer.acked) == [0, 1, 2, 3]
    assert (loop.scheduler.in_flight, loop.scheduler.holding) == (0, 0)


class FlaggedConsumer(FakeConsumer):
    """Says for each fetch whether it may carry retry metadata, as KmqConsumer does."""

    def __init__(self, batches: list[tuple[bool, list[KmqMessage]]]) -> None:
        super().__init__([batch for _, batch in batches], visibility_timeout_ms=9_000)
        self.flags = [flag for flag, _ in batches]

    def poll(self, timeout_s: float = 1.0) -> list[KmqMessage]:
        fetched = super().poll(timeout_s)
        if fetched:
            self.fetch_has_metadata = self.flags.pop(0)
        return fetched


def test_a_message_waiting_behind_its_key_is_checked_as_its_fetch_said_not_the_last_one() -> None:
    release = threading.Event()
    called: list[bytes] = []

    def handler(msg: KmqMessage) -> None:
        if msg.value == b"a0":
            assert release.wait(10)
        called.append(msg.value or b"")

    loop, _, producer = loop_for([], handler, ordering=Ordering.KEY)
    consumer = loop.consumer = FlaggedConsumer(
        [
            (False, [message("orders", 0, b"a0", _key=b"a")]),
            (True, [message("orders", 1, b"a1", _key=b"a", _headers=CORRUPT)]),
            (False, [message("orders", 2, b"b0", _key=b"b")]),
        ]
    )
    step_until(loop, lambda: not consumer.batches)  # a1 waits behind a0; b0's fetch is last
    step_until(loop, lambda: b"b0" in called)
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)

    assert sorted(called) == [b"a0", b"b0"]  # a1 is never called, though the last fetch was clean
    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.value == b"a1"


def test_unordered_failures_go_to_the_retry_topic_and_are_acked_after_the_copy() -> None:
    calls = Calls(sleep_s=0.0, fail_first={1})
    loop, consumer, producer = loop_for([keyed(4, [b"a"])], calls, ordering=Ordering.UNORDERED)

    step_until(loop, lambda: len(consumer.acked) == 4)
    loop.drain(1.0)

    assert [r.value for r in producer.to(RETRY_TOPIC)] == [b"v1"]
    assert len(calls.calls) == 4


def test_an_unordered_failure_whose_copy_fails_is_nacked_not_acked() -> None:
    calls = Calls(sleep_s=0.0, fail_first={0})
    loop, consumer, _ = loop_for(
        [keyed(2, [b"a"])], calls, producer=FakeProducer(failing_topics={RETRY_TOPIC})
    )

    step_until(loop, lambda: len(consumer.acked) + len(consumer.nacked) == 2)
    loop.drain(1.0)

    assert [m.offset for m in consumer.nacked] == [0]  # redelivered now rather than lost
    assert [m.offset for m in consumer.acked] == [1]


def test_a_fatal_error_goes_to_the_dlq_at_once_in_key_order_and_frees_the_key() -> None:
    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            raise KeyError("no such customer")

    batch = [message("orders", 0, b"a0", _key=b"a"), message("orders", 1, b"a1", _key=b"a")]
    loop, consumer, producer = loop_for([batch], handler, ordering=Ordering.KEY)

    step_until(loop, lambda: len(consumer.acked) == 2)
    loop.drain(1.0)

    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.header(DLQ_REASON) == b"non-retryable error KeyError"
    assert [m.offset for m in consumer.acked] == [0, 1]


def test_a_key_waiting_for_its_retry_does_not_spin_the_loop() -> None:
    clock = FakeClock()
    calls = Calls(sleep_s=0.0, fail_first={0})
    batch = [message("orders", 0, b"a0", _key=b"a"), message("orders", 1, b"a1", _key=b"a")]
    loop, consumer, _ = loop_for([batch], calls, ordering=Ordering.KEY, clock=clock)
    step_until(loop, lambda: loop.scheduler.next_due_ms() is not None)
    timeouts: list[float] = []
    fetch = consumer.poll

    def poll(timeout_s: float = 1.0) -> list[KmqMessage]:
        timeouts.append(timeout_s)
        return fetch(timeout_s)

    consumer.poll = poll  # type: ignore[method-assign]
    loop.step()
    clock.advance(4_800)  # the retry is due in ~5 s (jitter aside)
    loop.step()

    assert timeouts[0] == 0.5  # waits for a message, not busy
    assert 0.0 <= timeouts[1] < 0.5  # wakes up for the retry
    loop.drain(1.0)


def test_fetching_pauses_while_the_buffer_is_full() -> None:
    release = threading.Event()
    loop, consumer, _ = loop_for(
        [keyed(10, [b"a"]), [message("orders", 10)]],
        lambda _m: release.wait(5),
        concurrency=2,
        ordering=Ordering.KEY,
        max_buffered=5,
    )

    for _ in range(3):
        loop.step()

    # one key: one call running, the rest waiting (queued behind it in its run)
    assert (loop.stats.calls_in_flight, loop.stats.held) == (1, 10 - 1)
    assert consumer.held_fetching[-1] is True
    assert len(consumer.batches) == 1  # the second batch was not fetched
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 11)
    loop.drain(1.0)


def test_every_held_message_is_extended_each_third_of_the_visibility_timeout() -> None:
    clock = FakeClock()
    release = threading.Event()
    loop, consumer, _ = loop_for(
        [keyed(3, [b"a"])], lambda _m: release.wait(5), ordering=Ordering.KEY, clock=clock
    )
    loop.step()
    assert consumer.extended == []

    clock.advance(3_000)
    loop.step()

    assert sorted(m.offset for m, _ in consumer.extended) == [0, 1, 2]  # running and waiting
    assert {seconds for _, seconds in consumer.extended} == {9.0}
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)


def test_without_extend_running_only_the_messages_waiting_to_start_are_extended() -> None:
    clock = FakeClock()
    release = threading.Event()
    loop, consumer, _ = loop_for(
        [keyed(3, [b"a"])],
        lambda _m: release.wait(5),
        ordering=Ordering.KEY,
        clock=clock,
        extend_running=False,
    )
    loop.step()

    clock.advance(3_000)
    loop.step()

    assert sorted(m.offset for m, _ in consumer.extended) == [1, 2]  # offset 0 is running
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)


def test_stopping_acks_calls_that_end_in_time_and_leaves_the_rest() -> None:
    never = threading.Event()

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            time.sleep(0.1)
        else:
            never.wait(5)

    loop, consumer, _ = loop_for([keyed(6, [b"a"])], handler, concurrency=2)
    loop.step()
    loop.stop.set()

    loop.drain(0.5)

    assert [m.offset for m in consumer.acked] == [0]  # ended during the drain
    assert consumer.nacked == []  # the rest: redelivered after their timeout
    assert consumer.held_fetching[-1] is True
    never.set()


def test_a_stop_starts_no_more_of_a_keys_run_and_leaves_it_for_redelivery() -> None:
    # given one key's six messages, taken as one run, its first call slow
    release = threading.Event()
    called: list[int] = []

    def handler(msg: KmqMessage) -> None:
        called.append(msg.offset)
        if msg.offset == 0:
            assert release.wait(5)

    loop, consumer, _ = loop_for([keyed(6, [b"a"])], handler, ordering=Ordering.KEY)
    step_until(loop, lambda: called == [0])

    # when the worker stops while the first call runs, and it ends during the drain
    loop.stop.set()
    release.set()
    loop.drain(5.0)

    # then the first is acknowledged and the rest of the run never started
    assert [m.offset for m in consumer.acked] == [0] and called == [0]
    assert (loop.stats.calls_in_flight, consumer.nacked) == (0, [])


def test_runs_queued_for_a_thread_never_start_once_the_worker_stops() -> None:
    # given two threads in slow calls, and more runs queued behind them
    release = threading.Event()
    called: list[int] = []

    def handler(msg: KmqMessage) -> None:
        called.append(msg.offset)
        assert release.wait(5)

    loop, consumer, _ = loop_for([keyed(6, [b"a"])], handler, concurrency=2)
    step_until(loop, lambda: len(called) == 2)

    # when the worker stops, and the two calls end during the drain
    loop.stop.set()
    release.set()
    loop.drain(5.0)

    # then only they ran and were acknowledged: the queued runs are left for redelivery
    assert sorted(m.offset for m in consumer.acked) == sorted(called) and len(called) == 2
    assert loop.scheduler.in_flight == 0


def test_an_async_handler_runs_many_calls_at_once_on_one_event_loop_thread() -> None:
    threads: set[int] = set()
    running = [0, 0]  # now, most

    async def handler(_msg: KmqMessage) -> None:
        threads.add(threading.get_ident())
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep(0.02)
        running[0] -= 1

    loop, consumer, _ = loop_for([keyed(20, [b"a"])], handler, concurrency=8)

    step_until(loop, lambda: len(consumer.acked) == 20)
    loop.drain(1.0)

    assert len(threads) == 1
    assert 1 < running[1] <= 8


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()])
def test_a_handler_that_exits_stops_the_loop_and_its_message_is_not_acked(
    error: BaseException,
) -> None:
    def handler(_msg: KmqMessage) -> None:
        raise error

    loop, consumer, _ = loop_for([keyed(1, [b"a"])], handler)

    step_until(loop, loop.stop.is_set)
    loop.drain(1.0)

    assert consumer.acked == []
    assert loop.exit_code == (3 if isinstance(error, SystemExit) else None)


def test_an_open_breaker_starts_nothing_spends_no_retries_then_one_probe_recovers() -> None:
    clock = FakeClock()
    breaker = shared_breaker(clock)
    down = threading.Event()
    down.set()
    calls: list[int] = []

    def handler(msg: KmqMessage) -> None:
        calls.append(msg.offset)
        if down.is_set():
            raise Outage("503")

    loop, consumer, producer = loop_for(
        [keyed(8, [b"a"])], handler, concurrency=2, clock=clock, breaker=breaker
    )

    # when calls fail until the breaker opens
    step_until(loop, lambda: state_of(breaker) is State.OPEN and loop.scheduler.in_flight == 0)
    routed = len(producer.to(RETRY_TOPIC))
    assert routed < 8  # those failing once it opened are held, not retried
    called = len(calls)
    for _ in range(3):
        loop.step()
    assert consumer.held_fetching[-1] is True
    assert len(calls) == called  # nothing started while open
    assert len(producer.to(RETRY_TOPIC)) == routed

    # after the cooldown a probe succeeds, the breaker closes and the rest are handled
    down.clear()
    clock.advance(10_000)
    step_until(loop, lambda: len(consumer.acked) == 8)
    loop.drain(1.0)
    assert state_of(breaker) is State.CLOSED
    assert len(producer.to(RETRY_TOPIC)) == routed
    assert consumer.nacked == []


def test_a_message_waiting_to_start_never_leaves_the_loop_waiting_on_a_fetch() -> None:
    # given three messages of one partition in partition order: one runs at a time
    batch = [message("orders", i, b"x") for i in range(3)]
    loop, consumer, _ = loop_for([batch], lambda msg: None, ordering=Ordering.PARTITION)
    waits: list[tuple[float, int]] = []
    fetch = consumer.poll

    def poll(timeout_s: float = 1.0) -> list[KmqMessage]:
        waits.append((timeout_s, loop.scheduler.buffered))
        return fetch(timeout_s)

    consumer.poll = poll  # type: ignore[method-assign]
    # when the loop steps until all are acknowledged
    for _ in range(20):
        if len(consumer.acked) == 3:
            break
        loop.step()
    # then no poll waited while a message was buffered, ready once its predecessor ended
    assert len(consumer.acked) == 3
    assert [timeout for timeout, buffered in waits if buffered] == [0.0] * sum(
        1 for _, buffered in waits if buffered
    )


@pytest.mark.parametrize("ordering", [Ordering.UNORDERED, Ordering.KEY])
@pytest.mark.parametrize("error", [Unprintable(), GeneratorExit("closed")])
def test_an_unrenderable_exception_or_a_base_exception_fails_the_message_never_loses_it(
    ordering: Ordering, error: BaseException
) -> None:
    # given a handler that raises what a loop could choke on: no __str__, or a BaseException
    clock = FakeClock()

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            raise error

    batch = [message("orders", 0, b"a0", _key=b"a"), message("orders", 1, b"a1", _key=b"a")]
    loop, consumer, producer = loop_for([batch], handler, ordering=ordering, clock=clock)

    # when the loop runs until the failure has been retried (in place, in key order)
    def failure_settled() -> bool:
        clock.advance(1_000)  # retries in place come due
        return len(consumer.acked) == 2

    step_until(loop, failure_settled)
    loop.drain(1.0)

    # then both messages are acknowledged, the failed one after its copy, with a reason
    [copy] = producer.to(RETRY_TOPIC) or producer.to(QUEUE.dlq_topic)
    assert copy.value == b"a0"
    assert copy.header(ERROR_TYPE) == type(error).__name__.encode()
    if isinstance(error, Unprintable):
        assert copy.header(ERROR_MESSAGE) == b"<Unprintable: str() raised RuntimeError>"
    assert not loop.stop.is_set()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_stats_show_calls_in_flight_held_messages_and_each_wait_from_fetch_to_start(
    kind: str,
) -> None:
    # given key order, 4 messages of key "a" and 1 of "b", and calls that block until released
    # (a sync handler's runs observe waits on its threads; an async one's, the loop as it starts
    # them)
    clock = FakeClock()
    release = threading.Event()

    async def async_blocked(_m: KmqMessage) -> None:
        while not release.is_set():
            await asyncio.sleep(0.001)

    handler = async_blocked if kind == "async" else (lambda _m: release.wait(5))
    batch = [*keyed(4, [b"a"]), message("orders", 4, b"b4", _key=b"b")]
    loop, consumer, _ = loop_for([batch], handler, ordering=Ordering.KEY, clock=clock)

    # when the loop starts what it may and the clock moves on 2 s before the calls end
    loop.step()
    assert (loop.stats.calls_in_flight, loop.stats.held) == (2, 3)  # a0 and b4 run
    # (their waits are observed while they run, not only once they end)
    step_until(loop, lambda: loop.stats.waits is not None and loop.stats.waits.count == 2)
    waits = _waits_once_released_after_2_s(loop, consumer, clock, release, 5)

    # then each message's wait was observed once: a1 waited the 2 s, the first two none
    assert waits.count == 5
    assert waits.sum_s == pytest.approx(3 * 2.0)  # a1, a2, a3 started after the 2 s
    assert (loop.stats.calls_in_flight, loop.stats.held) == (0, 0)


def test_key_order_retries_in_place_are_counted_and_the_dlq_copy_keeps_the_first_failure_time() -> (
    None
):
    # given a key-ordered message that always fails (the policy allows one retry, after 5 s)
    clock = FakeClock()
    first_failed_ms = clock.now_ms

    def handler(msg: KmqMessage) -> None:
        raise Outage("down")

    loop, consumer, producer = loop_for(
        [[message("orders", 0, b"a0", _key=b"a")]], handler, ordering=Ordering.KEY, clock=clock
    )

    # when it fails, is retried in place 10 s later, and fails again
    step_until(loop, lambda: loop.scheduler.next_due_ms() is not None)
    assert loop.stats.retried_in_place == 1
    clock.advance(10_000)
    step_until(loop, lambda: len(consumer.acked) == 1)
    loop.drain(1.0)

    # then its DLQ copy says when it first failed, not when it failed last
    [dead] = producer.to(QUEUE.dlq_topic)
    assert dead.header(FIRST_FAILURE_MS) == str(first_failed_ms).encode()
    assert loop.stats.retried_in_place == 1  # the give-up is no retry
    assert loop.router.stats.retried == 0  # nothing went through a retry topic


def test_a_partition_fetched_again_from_an_earlier_offset_runs_the_new_copies_only() -> None:
    # given offsets 0-2 of a partition buffered in partition order, 0 running and slow
    release = threading.Event()
    ran: list[KmqMessage] = []

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            assert release.wait(30)
        ran.append(msg)

    first = [message("orders", offset) for offset in range(3)]
    again = [message("orders", offset) for offset in (5, 1, 2)]  # 5 first: added before the seek
    loop, consumer, _ = loop_for([first, again], handler, ordering=Ordering.PARTITION)
    loop.step()
    # when the partition comes back from offset 1 (after a rebalance) while 0 still runs
    loop.step()
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.step()

    # then 0 and the new copies of 1 and 2 ran (the earlier ones were left for redelivery,
    # never run and no longer kept visible); 5 went with the old copies, added before them
    new = [any(m is a for a in again) for m in ran]
    assert [m.offset for m in ran] == [0, 1, 2] and new == [False, True, True]
    assert set(map(id, consumer.acked)) == {id(first[0]), id(again[1]), id(again[2])}
    consumer.extended.clear()
    loop.clock_ms.advance(9_000)  # type: ignore[attr-defined]
    loop.step()
    assert consumer.extended == []  # nothing is held any more: the dropped copies are not


def _async_blocked_until(release: threading.Event, called: list[int]) -> Callable[..., object]:
    async def handler(msg: KmqMessage) -> None:
        called.append(msg.offset)
        while not release.is_set():
            await asyncio.sleep(0.001)

    return handler


def test_async_calls_waiting_for_a_slot_keep_key_order() -> None:
    # given 8 keys' messages in key order on three slots (more keys may start than slots),
    # one key's calls slow and the others' quick
    starts: list[tuple[bytes | None, int]] = []
    running: dict[bytes | None, int] = {}
    overlaps: list[int] = []
    handed: list[int] = []

    async def handler(msg: KmqMessage) -> None:
        if running.get(msg.key):
            overlaps.append(msg.offset)
        running[msg.key] = running.get(msg.key, 0) + 1
        starts.append((msg.key, msg.offset))
        await asyncio.sleep(0.01 if msg.key == b"k0" else 0)
        running[msg.key] -= 1

    keys = [b"k%d" % k for k in range(8)]
    loop, consumer, _ = loop_for([keyed(80, keys)], handler, concurrency=3, ordering=Ordering.KEY)

    # when the loop runs them all
    def all_acked() -> bool:
        handed.append(loop.scheduler.in_flight)
        return len(consumer.acked) == 80

    step_until(loop, all_acked)
    loop.drain(1.0)

    # then calls waited for a slot, yet no key ran twice at once and each started in order
    assert max(handed) > 3
    assert overlaps == []
    for key in keys:
        offsets = [offset for k, offset in starts if k == key]
        assert offsets == sorted(offsets) and len(offsets) == 10


def test_async_calls_waiting_for_a_slot_never_start_once_the_worker_stops() -> None:
    # given two slots busy with async calls, and more calls handed over behind them
    release = threading.Event()
    called: list[int] = []
    loop, consumer, _ = loop_for(
        [keyed(6, [b"a"])], _async_blocked_until(release, called), concurrency=2
    )
    step_until(loop, lambda: len(called) == 2)
    assert loop.scheduler.in_flight == 4  # two running, two waiting for a slot

    # when the worker stops, and the two calls end during the drain
    loop.stop.set()
    release.set()
    loop.drain(5.0)

    # then only they ran and were acknowledged: the waiting ones are left for redelivery
    assert sorted(m.offset for m in consumer.acked) == sorted(called) and len(called) == 2
    assert (loop.scheduler.in_flight, loop.stats.calls_in_flight, consumer.nacked) == (0, 0, [])


def test_an_async_call_that_waited_for_a_slot_has_that_wait_observed() -> None:
    # given two slots, four unordered messages: two run, two wait for a slot
    clock = FakeClock()
    release = threading.Event()
    called: list[int] = []
    loop, consumer, _ = loop_for(
        [keyed(4, [b"a"])], _async_blocked_until(release, called), concurrency=2, clock=clock
    )
    step_until(loop, lambda: len(called) == 2)

    # when the clock moves on 2 s before the first two end
    waits = _waits_once_released_after_2_s(loop, consumer, clock, release, 4)

    # then the two that waited for a slot observed the 2 s, the first two none
    assert waits.count == 4
    assert waits.sum_s == pytest.approx(2 * 2.0)


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_calls_waiting_for_a_thread_or_slot_of_a_partition_fetched_again_never_run(
    kind: str,
) -> None:
    # given offsets 0-3 unordered on two threads (or event loop slots): 0 and 1 run, 2 and 3
    # wait for one
    release = threading.Event()
    called: list[int] = []
    ran: list[KmqMessage] = []
    blocked = _async_blocked_until(release, called)

    async def async_handler(msg: KmqMessage) -> None:
        await blocked(msg)  # type: ignore[misc]
        ran.append(msg)

    def handler(msg: KmqMessage) -> None:
        called.append(msg.offset)
        assert release.wait(30)
        ran.append(msg)

    first = [message("orders", offset) for offset in range(4)]
    again = [message("orders", offset) for offset in (2, 3)]
    loop, consumer, _ = loop_for(
        [first, again], async_handler if kind == "async" else handler, concurrency=2
    )
    step_until(loop, lambda: len(called) == 2)
    # when the partition comes back from offset 2 (after a rebalance) while 0 and 1 run
    loop.step()
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 4)
    loop.drain(1.0)

    # then 0, 1 and the new copies of 2 and 3 ran: the earlier copies never did
    assert {id(m) for m in ran} == {id(first[0]), id(first[1]), id(again[0]), id(again[1])}
    assert len(ran) == 4
    assert (loop.scheduler.in_flight, loop.scheduler.holding) == (0, 0)


def test_traced_unordered_calls_on_threads_carry_their_wait_from_fetch_to_start(
    exporter: InMemorySpanExporter,
) -> None:
    # given three unordered messages on two threads, the clock 2 s on before the third starts
    clock = FakeClock()
    release = threading.Event()
    called: list[int] = []

    def handler(msg: KmqMessage) -> None:
        called.append(msg.offset)
        assert release.wait(30)

    loop, consumer, _ = loop_for([keyed(3, [b"a"])], handler, concurrency=2, clock=clock)
    assert isinstance(loop.runner, ThreadRunner)
    step_until(loop, lambda: len(called) == 2)
    clock.advance(2_000)
    release.set()
    step_until(loop, lambda: len(consumer.acked) == 3)
    loop.drain(1.0)

    # then every call's span says how long its message waited: the third 2 s, the others none
    waits = {
        span.attributes["messaging.kafka.offset"]: span.attributes[ORDERING_WAIT_MS]
        for span in exporter.get_finished_spans()
        if span.name == "process orders" and span.attributes
    }
    assert len(waits) == 3 and sorted(map(int, waits.values())) == [0, 0, 2_000], waits  # type: ignore[arg-type]


def test_a_keys_messages_fetched_while_its_run_goes_join_it_and_start_without_the_loop() -> None:
    # given key a's run of two, its first call running, then a fetch of two more of key a
    release = threading.Event()
    ran: list[int] = []

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0:
            assert release.wait(30)
        ran.append(msg.offset)

    first, later = keyed(2, [b"a"]), [message("orders", i, b"v", _key=b"a") for i in (2, 3)]
    loop, consumer, _ = loop_for([first, later], handler, ordering=Ordering.KEY)
    loop.step()
    loop.step()  # the later fetch comes in while a's run still runs
    # when the run's first call returns and the loop takes no further step
    release.set()
    # then the later two run after the first two, in order, on the run's thread: nothing had
    # to come back through the loop (which would start them only in its next step)
    assert wait_for(lambda: len(ran) == 4, timeout_s=30), ran
    assert ran == [0, 1, 2, 3]
    step_until(loop, lambda: len(consumer.acked) == 4)
    loop.drain(1.0)
    assert sorted(m.offset for m in consumer.acked) == [0, 1, 2, 3]
