"""A concurrent worker that stops with ``async def`` calls still running abandons them quietly:
each is cancelled and allowed to end, and a call that will not end is let go without asyncio's
"Task was destroyed but it is pending!" on the way out (which read as a crash at every stop)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import HandlerRunner
from tests.kafka_helpers import wait_for
from tests.unit.fakes import message


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

    runner = HandlerRunner(HandlerCall(hangs), 3)
    for offset in range(3):
        runner.submit(message("orders", offset))
    for _ in range(3):
        assert started.acquire(timeout=30)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        runner.close()
        del runner
        gc.collect()

    assert wait_for(lambda: len(cancelled) >= 3, timeout_s=30)  # every call was told
    assert "Task was destroyed but it is pending" not in caplog.text
