"""An ``async def`` handler's calls run on a few long-lived tasks (callers) rather than a task
each, yet every call starts as if it had a task of its own: what one call leaves behind in its
task (context variables, a cancellation request) never reaches a later call."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import threading
import time

import pytest

from kmq_dagster.worker.event_loops import EVENT_LOOP_ENV
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, EventLoopRunner, Unstarted
from tests.unit.fakes import call_ends, message

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


@pytest.fixture(autouse=True, params=["uvloop", "asyncio"])
def event_loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every rule holds on both loops a handler may run on (KMQ_EVENT_LOOP)."""
    monkeypatch.setenv(EVENT_LOOP_ENV, request.param)
    return str(request.param)


def _ends_of(runner: EventLoopRunner, count: int) -> list[CallEnd]:
    began = time.monotonic()
    ends: list[CallEnd] = []
    while len(ends) < count:
        assert time.monotonic() - began < 60, f"only {len(ends)} of {count} calls ended"
        ends += call_ends(runner.take_ends(0.05))
    return ends


def test_a_context_variable_one_call_sets_is_unset_in_the_next_call() -> None:
    seen: list[str] = []

    async def sets_the_tenant(msg: object) -> None:
        seen.append(TENANT.get())
        await asyncio.sleep(0)
        TENANT.set(f"tenant of offset {getattr(msg, 'offset', -1)}")  # never reset

    runner = EventLoopRunner(HandlerCall(sets_the_tenant))
    try:
        for offset in range(3):  # one after another: each could run on the last one's task
            runner.submit(message("orders", offset))
            assert [end.error for end in _ends_of(runner, 1)] == [None]
    finally:
        runner.close()
    assert seen == ["none", "none", "none"]


def test_a_cancellation_one_call_leaves_pending_does_not_fail_the_next_call() -> None:
    async def cancels_its_own_task(msg: object) -> str:
        if getattr(msg, "offset", -1) == 0:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # and returns before any await: the request stays pending
            return "returned"
        await asyncio.sleep(0.01)
        return "slept"

    runner = EventLoopRunner(HandlerCall(cancels_its_own_task))
    try:
        # Together: the first call's task, free at once, is the first to take the second.
        runner.submit(message("orders", 0))
        runner.submit(message("orders", 1))
        ends = _ends_of(runner, 2)
        runner.submit(message("orders", 2))  # and later, on whatever task is left
        ends += _ends_of(runner, 1)
    finally:
        runner.close()
    assert [(end.message.offset, end.error, end.result) for end in ends] == [
        (0, None, "returned"),
        (1, None, "slept"),
        (2, None, "slept"),
    ]


def test_calls_queued_behind_busy_callers_all_run_and_wait_together() -> None:
    at_once = [0, 0]  # now, most

    async def waits(msg: object) -> None:
        at_once[0] += 1
        at_once[1] = max(at_once)
        await asyncio.sleep(0.02)
        at_once[0] -= 1

    runner = EventLoopRunner(HandlerCall(waits))
    try:
        for wave in range(3):  # each wave submitted while the last one's calls still wait
            for offset in range(wave * 20, wave * 20 + 20):
                runner.submit(message("orders", offset))
            runner.begin()
        ends = _ends_of(runner, 60)
    finally:
        runner.close()
    assert sorted(end.message.offset for end in ends) == list(range(60))
    assert at_once[1] == 60


class _Incomparable:
    def __eq__(self, other: object) -> bool:
        raise TypeError("compare me not")

    __hash__ = object.__hash__


SETTING: contextvars.ContextVar[object] = contextvars.ContextVar("setting")


def test_a_context_value_that_refuses_comparison_ends_its_task_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def body() -> list[CallEnd]:
        SETTING.set(_Incomparable())  # in the context every task copies

        async def replaces_it(msg: object) -> None:
            await asyncio.sleep(0)
            SETTING.set(_Incomparable())  # equal to the first only if compared: it raises

        runner = EventLoopRunner(HandlerCall(replaces_it))
        try:
            ends = []
            for offset in range(2):
                runner.submit(message("orders", offset))
                ends += _ends_of(runner, 1)
            return ends
        finally:
            runner.close()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        ends = contextvars.copy_context().run(body)  # the test's own context stays as it was
        gc.collect()  # a task that ended with an exception nobody took says so when collected
    assert [(end.message.offset, end.error) for end in ends] == [(0, None), (1, None)]
    assert "exception was never retrieved" not in caplog.text


def test_calls_that_never_wait_are_all_run_by_one_caller() -> None:
    tasks_seen: list[int] = []

    async def returns_at_once(msg: object) -> int:
        tasks_seen.append(len(asyncio.all_tasks()))
        return getattr(msg, "offset", -1)

    runner = EventLoopRunner(HandlerCall(returns_at_once))
    try:
        for offset in range(100):
            runner.submit(message("orders", offset))
        runner.begin()
        ends = call_ends(runner.take_ends(0.0))
    finally:
        runner.close()
    assert [end.result for end in ends] == list(range(100))  # all ended in begin's run, in order
    assert max(tasks_seen) == 1  # one caller was made for them, not one each


def test_every_call_that_waits_has_started_when_begin_returns() -> None:
    started: list[int] = []
    release = asyncio.Event()

    async def waits_for_release(msg: object) -> None:
        offset = getattr(msg, "offset", -1)
        if offset == 999:
            release.set()
            return
        started.append(offset)
        await release.wait()

    runner = EventLoopRunner(HandlerCall(waits_for_release))
    try:
        for offset in range(50):
            runner.submit(message("orders", offset))
        runner.begin()
        assert sorted(started) == list(range(50))  # all waiting at once, none left queued
        runner.submit(message("orders", 999))
        ends = _ends_of(runner, 51)
    finally:
        runner.close()
    assert sorted(end.message.offset for end in ends) == [*range(50), 999]


def test_no_more_calls_run_than_max_calls_and_an_ended_call_is_followed_at_once() -> None:
    # given six calls for two slots, each awaiting 20 ms
    running, started = [0, 0], []  # now, most; start order

    async def waits(msg: object) -> None:
        started.append(getattr(msg, "offset", -1))
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep(0.02)
        running[0] -= 1

    runner = EventLoopRunner(HandlerCall(waits), max_calls=2)
    try:
        for offset in range(6):
            runner.submit(message("orders", offset))
        runner.begin()
        assert started == [0, 1]  # two slots: the rest wait
        # when the first ends, then the next call starts in that same run: no submit, no begin
        first = call_ends(runner.take_ends(5.0))
        assert len(started) == 2 + len(first)
        ends = first + _ends_of(runner, 6 - len(first))
    finally:
        runner.close()
    assert running[1] == 2
    assert sorted(end.message.offset for end in ends) == list(range(6))


def test_once_stopped_calls_waiting_for_a_slot_come_back_unstarted() -> None:
    stop = threading.Event()
    release = asyncio.Event()
    started: list[int] = []

    async def blocked(msg: object) -> None:
        started.append(getattr(msg, "offset", -1))
        await release.wait()

    runner = EventLoopRunner(HandlerCall(blocked), max_calls=1, stop=stop)
    try:
        for offset in range(3):
            runner.submit(message("orders", offset))
        runner.begin()
        stop.set()
        taken = runner.take_ends(0.0)
    finally:
        runner.close()
    assert started == [0]
    unstarted = [end for end in taken if isinstance(end, Unstarted)]
    assert [[m.offset for m in end.messages] for end in unstarted] == [[1], [2]]


def test_calls_waiting_for_the_slot_of_a_caller_that_left_still_run() -> None:
    # given one slot and three calls, the first of which leaves a context variable set (its
    # caller ends after it: a later call must not inherit it)
    seen: list[str] = []

    async def sets_tenant(msg: object) -> None:
        seen.append(TENANT.get())
        if getattr(msg, "offset", -1) == 0:
            TENANT.set("acme")
        await asyncio.sleep(0.001)

    runner = EventLoopRunner(HandlerCall(sets_tenant), max_calls=1)
    try:
        for offset in range(3):
            runner.submit(message("orders", offset))
        # then the other two still run, on a new caller, with nothing more submitted
        ends = _ends_of(runner, 3)
    finally:
        runner.close()
    assert sorted(end.message.offset for end in ends) == [0, 1, 2]
    assert seen == ["none", "none", "none"]
