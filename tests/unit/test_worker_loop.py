"""The worker loop at concurrency 1 (calls on the loop's own thread) on in-memory fakes: acks,
retry routing, nacks when a copy fails, the breaker holding messages, exits. Fake clock, no
broker. (``test_concurrent_loop`` runs the same loop above 1.)"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator

import pytest

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State
from kmq_dagster.core.headers import DLQ_REASON, ERROR_MESSAGE, ERROR_TYPE, ORIGINAL_TIMESTAMP_MS
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.opened_queue import vouch_for
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.loop import WorkerLoop
from tests.unit.fakes import FakeClock, FakeConsumer, FakeProducer, message

QUEUE = Queue("orders", "billing", partitions=1, retry_policy=RetryPolicy.fixed([5_000]))
RETRY_TOPIC = QUEUE.retry_topics[5_000]


class Outage(RuntimeError):
    pass


def loop_for(
    batches: list[list[KmqMessage]],
    handler: Callable[[KmqMessage], object],
    *,
    producer: FakeProducer | None = None,
    breaker: SharedBreaker | None = None,
    policy: RetryPolicy | None = None,
    clock: Callable[[], int] | None = None,
    ordering: Ordering = Ordering.PARTITION,
    visibility_timeout_ms: int = 9_000,
) -> tuple[WorkerLoop, FakeConsumer, FakeProducer]:
    clock = clock or FakeClock()
    producer = producer or FakeProducer()
    # A handle as opening would give it (no broker here to open it on).
    opened = vouch_for(KmqSettings(), QUEUE.replace(retry_policy=policy or QUEUE.retry_policy))
    router = RetryRouter(
        opened, clock_ms=clock, rng=random.Random(1), producer=producer,  # type: ignore[arg-type]
    )  # fmt: skip
    consumer = FakeConsumer(batches, visibility_timeout_ms=visibility_timeout_ms)
    loop = WorkerLoop(
        consumer,  # checked against the LoopConsumer protocol
        HandlerCall(handler),
        threading.Event(),
        router=router,
        breaker=breaker,
        clock_ms=clock,
        concurrency=1,  # what Worker(opened, handler) runs
        ordering=ordering,
        max_buffered=500,
    )
    return loop, consumer, producer


def fails_on(*values: bytes, error: type[Exception] = Outage) -> Callable[[KmqMessage], None]:
    def handler(msg: KmqMessage) -> None:
        if msg.value in values:
            raise error(f"{msg.value!r} failed")

    return handler


def test_successes_are_acked_and_failures_acked_only_after_their_retry_copy_is_written() -> None:
    # given a batch where "b" fails
    batch = [message("orders", i, v) for i, v in enumerate([b"a", b"b", b"c"])]
    loop, consumer, producer = loop_for([batch], fails_on(b"b"))

    # when the worker takes one step
    loop.step()

    # then all three are acked in fetch order, "b" once its copy reached the retry topic
    # (due in 5 s) and before "c" started: one message at a time
    assert [m.value for m in consumer.acked] == [b"a", b"b", b"c"]
    (copy,) = producer.to(RETRY_TOPIC)
    assert copy.value == b"b" and copy.partition == 0
    assert copy.header(ATTEMPT) == b"2"
    assert int(copy.header(DUE_MS) or 0) == FakeClock().now_ms + 5_000
    assert copy.header(ORIGINAL_TIMESTAMP_MS) == b"1700000000000"  # not 0
    assert (loop.stats.handled, loop.stats.failed) == (2, 1)


def test_a_value_the_handler_replaced_before_failing_is_retried_as_fetched() -> None:
    # given a handler that sets the message's value to something else, then fails
    def handler(msg: KmqMessage) -> None:
        msg.value = b"half-processed"
        raise Outage("failed")

    loop, consumer, producer = loop_for([[message("orders", 0, b"original")]], handler)

    # when the worker takes one step
    loop.step()

    # then the retry copy carries the bytes the message was fetched with
    (copy,) = producer.to(RETRY_TOPIC)
    assert copy.value == b"original"
    assert len(consumer.acked) == 1


def test_a_retry_copy_the_broker_refuses_is_nacked_never_acked() -> None:
    producer = FakeProducer(failing_topics={RETRY_TOPIC})
    loop, consumer, _ = loop_for([[message("orders", 0, b"x")]], fails_on(b"x"), producer=producer)

    loop.step()

    assert consumer.acked == []
    assert [m.value for m in consumer.nacked] == [b"x"]  # redelivered now, not lost
    assert loop.router is not None and loop.router.stats.write_failures == 1


def test_fatal_errors_go_straight_to_the_dlq_with_the_reason() -> None:
    policy = QUEUE.retry_policy.with_non_retryable(["KeyError"])
    loop, consumer, producer = loop_for(
        [[message("orders", 0, b"bad")]], fails_on(b"bad", error=KeyError), policy=policy
    )

    loop.step()

    (dead,) = producer.to(QUEUE.dlq_topic)
    assert dead.header(DLQ_REASON) == b"non-retryable error KeyError"
    assert [m.value for m in consumer.acked] == [b"bad"]


def shared_breaker(clock: FakeClock, **config: int) -> SharedBreaker:
    settings = {"window_ms": 60_000, "min_calls": 5, "consecutive_failures": 3,
                "cooldown_ms": 10_000, "probes": 1, **config}  # fmt: skip
    return SharedBreaker(CircuitBreaker(BreakerConfig(**settings)), QUEUE)


def state_of(breaker: SharedBreaker) -> State:
    """The breaker's state, read anew (a function, so type checkers do not pin it)."""
    return breaker.state


def test_fatal_errors_do_not_count_for_the_breaker_neither_as_failures_nor_as_successes() -> None:
    # given an outage (3 failures in a row open the breaker) mixed with poison messages
    clock = FakeClock()
    breaker = shared_breaker(clock)
    policy = QUEUE.retry_policy.with_non_retryable(["ValueError"])

    def handler(msg: KmqMessage) -> None:
        raise (ValueError if msg.value == b"poison" else Outage)("boom")

    batch = [message("orders", i, v) for i, v in enumerate([b"x", b"poison", b"y", b"poison"])]
    loop, _, _ = loop_for([batch], handler, breaker=breaker, policy=policy, clock=clock)

    loop.step()

    # then the window holds the two outage failures only: the poison did not dilute the rate
    assert breaker.breaker.window(clock.now_ms) == (1.0, 2)
    assert state_of(breaker) is State.CLOSED


def test_an_open_breaker_holds_messages_and_spends_no_retries_then_probes_and_recovers() -> None:
    clock = FakeClock()
    breaker = shared_breaker(clock)
    down = [True]

    def handler(msg: KmqMessage) -> None:
        if down[0]:
            raise Outage("503")

    batch = [message("orders", i, str(i).encode()) for i in range(6)]
    loop, consumer, producer = loop_for([batch], handler, breaker=breaker, clock=clock)

    # when three fail in a row, the breaker opens: the third and the rest are held
    loop.step()
    assert state_of(breaker) is State.OPEN
    assert len(producer.to(RETRY_TOPIC)) == 2  # only the failures before it opened
    assert loop.stats.held == 4  # the one that opened it, and 3, 4, 5 never started
    assert sorted(m.value or b"" for m in consumer.acked) == [b"0", b"1"]

    # while open, nothing is fetched or handled; held messages keep their visibility
    clock.advance(3_000)  # a third of the 9 s visibility timeout
    loop.step()
    assert consumer.held_fetching[-1] is True
    assert len(consumer.extended) == 4 and consumer.extended[0][1] == 9.0
    assert len(producer.to(RETRY_TOPIC)) == 2

    # after the cooldown one probe succeeds, the breaker closes, the held ones are handled
    down[0] = False
    clock.advance(10_000)
    loop.step()
    loop.step()
    assert state_of(breaker) is State.CLOSED
    assert sorted(m.value or b"" for m in consumer.acked) == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert len(producer.to(RETRY_TOPIC)) == 2
    assert consumer.nacked == []


def test_a_fatal_probe_frees_its_slot_so_the_half_open_breaker_is_not_stuck() -> None:
    # given a half-open breaker allowing one probe
    clock = FakeClock()
    breaker = shared_breaker(clock)
    breaker.breaker.adopt(State.HALF_OPEN, clock.now_ms, 10_000)
    policy = QUEUE.retry_policy.with_non_retryable(["ValueError"])
    batch = [message("orders", 0, b"poison"), message("orders", 1, b"good")]
    loop, consumer, _ = loop_for(
        [batch], fails_on(b"poison", error=ValueError), breaker=breaker, policy=policy, clock=clock
    )

    # when the probe turns out to be bad input, the next message may probe instead
    loop.step()

    assert state_of(breaker) is State.CLOSED
    assert [m.value for m in consumer.acked] == [b"poison", b"good"]  # poison after its DLQ copy


def test_system_exit_in_a_handler_stops_the_loop_unacknowledged_with_its_code() -> None:
    def handler(msg: KmqMessage) -> None:
        raise SystemExit(3)

    loop, consumer, producer = loop_for([[message("orders", 0), message("orders", 1)]], handler)

    loop.step()

    assert loop.stop.is_set() and loop.exit_code == 3
    assert consumer.acked == [] and producer.delivered == []  # redelivered after its timeout


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_handler_leaves_the_rest_of_the_batch_unhandled(
    interrupt: type[BaseException],
) -> None:
    calls: list[bytes | None] = []

    def handler(msg: KmqMessage) -> None:
        calls.append(msg.value)
        raise interrupt()

    loop, consumer, _ = loop_for(
        [[message("orders", 0, b"a"), message("orders", 1, b"b")]], handler
    )

    loop.step()

    assert calls == [b"a"] and consumer.acked == []


def test_an_async_handler_is_acked_only_after_its_coroutine_ran() -> None:
    # given an `async def` handler that records what it awaited its way through
    done: list[bytes] = []

    async def handler(msg: KmqMessage) -> None:
        await asyncio.sleep(0)
        done.append(msg.value or b"")

    loop, consumer, _ = loop_for([[message("orders", i, v) for i, v in enumerate([b"a", b"b"])]],
                                 handler)  # fmt: skip
    # when the worker takes one step
    loop.step()
    # then both ran before they were acknowledged
    assert done == [b"a", b"b"]
    assert [m.value for m in consumer.acked] == [b"a", b"b"]


def test_an_async_handler_that_raises_is_retried_like_a_sync_one() -> None:
    async def handler(msg: KmqMessage) -> None:
        await asyncio.sleep(0)
        raise Outage("downstream is down")

    loop, _, producer = loop_for([[message("orders", 0, b"x")]], handler)
    loop.step()
    assert [c.value for c in producer.to(RETRY_TOPIC)] == [b"x"]
    assert (loop.stats.handled, loop.stats.failed) == (0, 1)


def test_an_awaitable_returned_by_a_plain_function_is_awaited_before_the_ack() -> None:
    done: list[bytes] = []

    async def work(msg: KmqMessage) -> None:
        done.append(msg.value or b"")

    def handler(msg: KmqMessage) -> Coroutine[object, object, None]:
        return work(msg)  # a plain function: the worker cannot tell from its signature

    loop, consumer, _ = loop_for([[message("orders", 0, b"x")]], handler)
    loop.step()
    assert done == [b"x"] and [m.value for m in consumer.acked] == [b"x"]


def test_a_generator_function_is_refused_before_anything_is_consumed() -> None:
    def handler(msg: KmqMessage) -> Iterator[None]:
        yield None

    with pytest.raises(ConfigError, match="generator function"):
        loop_for([[message("orders", 0, b"x")]], handler)


def test_a_generator_returned_at_run_time_goes_to_the_dlq_never_acked_as_done() -> None:
    def steps(msg: KmqMessage) -> Iterator[None]:
        yield None

    def handler(msg: KmqMessage) -> Iterator[None]:
        return steps(msg)  # a plain function returning a generator: none of its work ran

    loop, consumer, producer = loop_for([[message("orders", 0, b"x")]], handler)
    loop.step()
    (dead,) = producer.to(QUEUE.dlq_topic)
    assert dead.header(ERROR_TYPE) == b"HandlerResultError"
    assert b"generator" in (dead.header(ERROR_MESSAGE) or b"")
    assert [m.value for m in consumer.acked] == [b"x"]  # acknowledged after its DLQ copy
    assert loop.stats.handled == 0


class Unprintable(ValueError):
    """An exception whose ``str()`` raises, as a careless handler's may."""

    def __str__(self) -> str:
        raise RuntimeError("cannot render")


def raises(error: BaseException) -> Callable[[KmqMessage], None]:
    def handler(msg: KmqMessage) -> None:
        raise error

    return handler


def test_an_exception_that_cannot_be_rendered_is_retried_with_a_placeholder_reason() -> None:
    # given a handler raising an exception whose __str__ raises, and a message after it
    batch = [message("orders", 0, b"x"), message("orders", 1, b"y")]
    loop, consumer, producer = loop_for([batch], raises(Unprintable()))

    # when the worker takes a step, it does not crash
    loop.step()

    # then the message went to its retry topic with a placeholder, and was acked after the copy
    first, _ = producer.to(RETRY_TOPIC)
    assert first.header(ERROR_TYPE) == b"Unprintable"
    assert first.header(ERROR_MESSAGE) == b"<Unprintable: str() raised RuntimeError>"
    assert [m.value for m in consumer.acked] == [b"x", b"y"]
    assert loop.stats.failed == 2


@pytest.mark.parametrize("error", [GeneratorExit("closed"), asyncio.CancelledError()])
def test_a_base_exception_other_than_an_exit_fails_the_message_and_the_loop_goes_on(
    error: BaseException,
) -> None:
    batch = [message("orders", 0, b"x")]
    loop, consumer, producer = loop_for([batch], raises(error))

    loop.step()

    (copy,) = producer.to(RETRY_TOPIC)
    assert copy.header(ERROR_TYPE) == type(error).__name__.encode()
    assert [m.value for m in consumer.acked] == [b"x"]
    assert not loop.stop.is_set()


def test_the_log_line_of_a_failed_call_masks_the_secrets_of_its_error_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given a handler that puts the message's secret into its exception, as handlers do
    error = ValueError("order rejected: {'card_number': '4111111111111111', 'password': 'Pw99x'}")
    loop, _consumer, producer = loop_for([[message("orders", 0, b"x")]], raises(error))

    # when it fails, with the worker logging at INFO
    with caplog.at_level("INFO", logger="kmq_dagster"):
        loop.step()

    # then the log line names the failure without the secrets; the copy keeps the text as is
    [line] = [r.getMessage() for r in caplog.records if "handler failed" in r.getMessage()]
    assert "order rejected" in line and "Pw99x" not in line and "4111111111111111" not in line
    (copy,) = producer.to(RETRY_TOPIC)
    assert b"Pw99x" in (copy.header(ERROR_MESSAGE) or b"")


def test_one_call_at_a_time_on_the_loops_thread_each_acked_before_the_next_starts() -> None:
    # given a fetch of three messages and a handler noting what it sees when called
    seen: list[tuple[str, list[bytes | None], bool, int]] = []

    def handler(msg: KmqMessage) -> None:
        acked = [m.value for m in consumer.acked]
        seen.append((threading.current_thread().name, acked, msg in consumer.acked,
                     loop.stats.calls_in_flight))  # fmt: skip

    batch = [message("orders", i, v) for i, v in enumerate([b"a", b"b", b"c"])]
    loop, consumer, _ = loop_for([batch], handler)

    # when the worker takes one step
    loop.step()

    # then each call ran on this thread, in fetch order, after the previous one's ack and
    # before its own; the stop deadline of `kmq worker` saw one call in flight meanwhile
    here = threading.current_thread().name
    assert seen == [
        (here, [], False, 1),
        (here, [b"a"], False, 1),
        (here, [b"a", b"b"], False, 1),
    ]
    assert loop.stats.calls_in_flight == 0 and loop.stats.handled == 3


def test_a_stop_during_a_call_acks_that_call_and_starts_no_other() -> None:
    # given a handler during whose first call the worker is asked to stop (SIGTERM, Ctrl-C)
    calls: list[bytes | None] = []

    def handler(msg: KmqMessage) -> None:
        calls.append(msg.value)
        loop.stop.set()

    batch = [message("orders", 0, b"a"), message("orders", 1, b"b")]
    loop, consumer, _ = loop_for([batch], handler)

    loop.step()
    loop.drain(1.0)

    # then the call that returned is acknowledged; the other waits for its redelivery
    assert calls == [b"a"]
    assert [m.value for m in consumer.acked] == [b"a"]


def test_messages_waiting_behind_slow_calls_have_their_visibility_extended() -> None:
    # given a fetch of four messages whose calls take 4 s each (fake clock), visibility 9 s
    clock = FakeClock()

    def handler(msg: KmqMessage) -> None:
        clock.advance(4_000)

    batch = [message("orders", i, b"%d" % i) for i in range(4)]
    loop, consumer, _ = loop_for([batch], handler, clock=clock)

    # when the worker runs the whole fetch in one step (16 s)
    loop.step()

    # then the last message, started 12 s after the fetch, was extended while it waited
    extended = [m.value for m, seconds in consumer.extended if seconds == 9.0]
    assert b"3" in extended and b"0" not in extended
    assert len(consumer.acked) == 4


def run_on_the_real_clock(fetches: list[list[KmqMessage]], slow: bytes) -> FakeConsumer:
    """Run ``fetches`` (a step each) on the real clock, visibility 3 s (a third: 1 s); the
    call of the message valued ``slow`` lasts until the loop's extension alarm has rung."""
    loop: WorkerLoop | None = None

    def handler(msg: KmqMessage) -> None:
        assert loop is not None
        started = time.monotonic()
        while msg.value == slow and not loop._alarm.rung:
            assert time.monotonic() - started < 10, "the extension alarm never rang"
            time.sleep(0.001)

    steps = len(fetches)  # the fake consumer takes them from the list
    loop, consumer, _ = loop_for(fetches, handler, clock=wall_clock_ms, visibility_timeout_ms=3_000)
    try:
        for _ in range(steps):
            loop.step()
    finally:
        loop.close()
    return consumer


def test_on_the_real_clock_the_calls_waiting_behind_a_slow_one_are_extended_after_it() -> None:
    # given a fetch of three messages on the real clock, the first call slow (until the
    # loop's extension alarm rang)
    batch = [message("orders", i, b"%d" % i) for i in range(3)]

    # when the worker runs the fetch
    consumer = run_on_the_real_clock([batch], slow=b"0")

    # then the two waiting behind the slow call were extended after it, by the whole timeout
    assert [(m.value, seconds) for m, seconds in consumer.extended][:2] == [
        (b"1", 3.0), (b"2", 3.0),
    ]  # fmt: skip
    assert len(consumer.acked) == 3


def test_on_the_real_clock_an_alarm_armed_in_one_fetch_rings_in_a_later_one() -> None:
    # given two fetches on the real clock: the first runs at once (the loop arms its alarm
    # for that deadline, once); the second's first call is slow (until the alarm rang)
    first = [message("orders", i, b"fast") for i in range(2)]
    second = [message("orders", 2, b"slow"), message("orders", 3, b"3")]

    # when the worker runs both fetches
    consumer = run_on_the_real_clock([first, second], slow=b"slow")

    # then the message waiting behind the slow call of the second fetch was extended after it
    assert [(m.value, seconds) for m, seconds in consumer.extended][:1] == [(b"3", 3.0)]
    assert len(consumer.acked) == 4


def test_messages_waiting_behind_calls_are_extended_once_every_third_of_the_timeout() -> None:
    # given a fetch of six messages whose calls take 2 s each (fake clock), visibility 9 s:
    # a third of it is 3 s
    clock = FakeClock()

    def handler(msg: KmqMessage) -> None:
        clock.advance(2_000)

    batch = [message("orders", i, b"%d" % i) for i in range(6)]
    loop, consumer, _ = loop_for([batch], handler, clock=clock)

    # when the worker runs the whole fetch in one step (12 s)
    loop.step()

    # then what waits is extended after the calls ending at 4 s and 8 s (the first ends 3 s
    # or more after the last extension), by the whole timeout each time, and at no other call
    assert [(m.value, seconds) for m, seconds in consumer.extended] == [
        (b"2", 9.0), (b"3", 9.0), (b"4", 9.0), (b"5", 9.0),
        (b"4", 9.0), (b"5", 9.0),
    ]  # fmt: skip
    assert len(consumer.acked) == 6


def test_a_key_ordered_failure_is_retried_in_place_and_holds_only_its_own_key() -> None:
    # given key order, one call at a time, and a fetch where the first of key "a" fails once
    clock = FakeClock()
    failed_once: set[int] = set()

    def handler(msg: KmqMessage) -> None:
        if msg.offset == 0 and not failed_once:
            failed_once.add(0)
            raise Outage("down for a moment")

    batch = [
        message("orders", 0, b"a0", _key=b"a"),
        message("orders", 1, b"a1", _key=b"a"),
        message("orders", 2, b"b2", _key=b"b"),
    ]
    loop, consumer, producer = loop_for([batch], handler, clock=clock, ordering=Ordering.KEY)

    # when the worker steps before the retry is due
    loop.step()
    loop.step()

    # then the other key went on, "a1" waits behind "a0", and nothing left for a retry topic
    assert [m.value for m in consumer.acked] == [b"b2"]
    assert loop.stats.retried_in_place == 1 and loop.stats.held == 2

    # when the retry is due: "a0" runs again, then "a1"
    clock.advance(5_000)
    loop.step()
    assert [m.value for m in consumer.acked] == [b"b2", b"a0", b"a1"]
    assert producer.delivered == [] and consumer.nacked == []


def test_after_a_failure_routed_to_its_retry_topic_the_rest_of_the_fetch_runs_on() -> None:
    # given partition order and a fetch where the second message fails
    batch = [message("orders", i, v) for i, v in enumerate([b"a", b"b", b"c", b"d"])]
    loop, consumer, producer = loop_for([batch], fails_on(b"b"))

    # when the worker takes one step
    loop.step()

    # then the failure's copy is written and acked, and the rest ran in the same step
    assert [m.value for m in consumer.acked] == [b"a", b"b", b"c", b"d"]
    assert [p.topic for p in producer.delivered] == [RETRY_TOPIC]
    assert loop.stats.held == 0 and not loop.scheduler.holds_any


@pytest.mark.parametrize("concurrency", [0, 1025])
def test_worker_refuses_a_concurrency_out_of_bounds_in_the_words_of_every_front_end(
    concurrency: int,
) -> None:
    from kmq_dagster.worker.worker import Worker

    with pytest.raises(ConfigError, match=rf"^concurrency: {concurrency} is not in \[1, 1024\]$"):
        Worker(vouch_for(KmqSettings(), QUEUE), lambda _message: None, concurrency=concurrency)
