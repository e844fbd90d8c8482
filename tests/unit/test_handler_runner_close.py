"""A concurrent worker that stops with ``async def`` calls still running abandons them quietly:
each is cancelled and allowed to end, and a call that will not end is let go without asyncio's
"Task was destroyed but it is pending!" on the way out (which read as a crash at every stop).
And the event loop the caller's thread drives runs its calls concurrently, each to its end."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest

from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, EventLoopRunner
from tests.kafka_helpers import wait_for
from tests.unit.fakes import call_ends, message


@pytest.mark.parametrize("obeys_cancel", [True, False], ids=["ends when cancelled", "ignores it"])
def test_calls_running_at_close_leave_no_pending_task_behind(
    caplog: pytest.LogCaptureFixture, obeys_cancel: bool
) -> None:
    started = threading.Semaphore(0)
    cancelled: list[int] = []

    async def hangs(message: object) -> None:
        started.release()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(1)
                if obeys_cancel:
                    raise

    runner = EventLoopRunner(HandlerCall(hangs))
    for offset in range(3):
        runner.submit(message("orders", offset))
    assert runner.take_ends(0.0) == []  # the calls start while the caller waits for ends
    for _ in range(3):
        assert started.acquire(timeout=0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        runner.close()
        del runner
        gc.collect()

    assert wait_for(lambda: len(cancelled) >= 3, timeout_s=30)  # every call was told
    assert "Task was destroyed but it is pending" not in caplog.text


def test_calls_on_the_callers_event_loop_wait_together_and_each_end_is_taken_once() -> None:
    waiting = [0, 0]  # now, most at once

    async def waits(msg: object) -> int:
        waiting[0] += 1
        waiting[1] = max(waiting)
        await asyncio.sleep(0.05)
        waiting[0] -= 1
        if getattr(msg, "offset", None) == 3:
            raise ValueError("offset 3")
        return 1

    runner = EventLoopRunner(HandlerCall(waits))
    began = time.monotonic()
    for offset in range(10):
        runner.submit(message("orders", offset))
    ends: list[CallEnd] = []
    while len(ends) < 10:
        assert time.monotonic() - began < 60, f"only {len(ends)} of 10 calls ended"
        ends += call_ends(runner.take_ends(0.05))
    runner.close()

    assert waiting[1] == 10  # all ten awaited at once
    assert sorted(end.message.offset for end in ends) == list(range(10))
    failed = [end for end in ends if end.error is not None]
    assert [(end.message.offset, str(end.error)) for end in failed] == [(3, "offset 3")]
    assert all(end.result == 1 for end in ends if end.error is None)


def test_begin_starts_the_calls_submitted_so_they_wait_while_the_caller_works() -> None:
    started: list[int] = []

    async def waits(msg: object) -> None:
        started.append(getattr(msg, "offset", -1))
        await asyncio.sleep(0.01)

    runner = EventLoopRunner(HandlerCall(waits))
    runner.submit(message("orders", 0))
    runner.submit(message("orders", 1))
    runner.begin()
    assert started == [0, 1]  # both are waiting now, before any wait for ends
    runner.begin()  # nothing new: no run
    ends: list[CallEnd] = []
    while len(ends) < 2:
        ends += call_ends(runner.take_ends(1.0))
    runner.close()
    assert [end.error for end in ends] == [None, None]
