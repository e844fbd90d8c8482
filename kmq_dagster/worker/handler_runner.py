"""Runs handler calls for the worker loop and reports each call's end to it.

:class:`InlineRunner` (one call at a time) runs each call on the loop's own thread, at once:
no thread, no queue, no hand-off. :class:`HandlerRunner` runs calls beside the loop: a sync
handler on ``N`` daemon threads; an ``async def`` handler runs as tasks on one event
loop in a thread of its own (no thread per message). How many calls run at once is the caller's
rule (the :class:`~kmq_dagster.core.ordering.LaneScheduler`'s in-flight limit): a call starts
as soon as it is submitted. Each end is put on :attr:`HandlerRunner.ends`, read by the loop
thread only, so only that thread touches the scheduler, the router and the breaker.

The threads are daemons, and :meth:`HandlerRunner.close` does not wait for a call that is still
running: a hung handler must not keep a stopped worker alive. Its message is not acknowledged,
so the tracker redelivers it after the visibility timeout (invariant 1).
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.tracing import processing, tracing_active
from kmq_dagster.worker.handler_call import HandlerCall

#: Span attributes of one call (``None``: none beyond the message's own).
Attributes = Mapping[str, Any] | None
#: A call to start: the message, and its span's attributes.
Job = tuple[KmqMessage, Attributes]

#: How long calls cancelled when the runner closes get to end, in seconds.
CANCEL_WAIT_S = 1.0


@dataclass(frozen=True)
class CallEnd:
    """One call's end: ``error`` is ``None`` when the handler returned, ``result`` what it
    returned (awaited), which Spark writes to its sink."""

    message: KmqMessage
    error: BaseException | None
    result: object = None


def is_async_handler(handler: Callable[..., object]) -> bool:
    """``async def`` (a function, a partial, or an object whose ``__call__`` is one)."""
    call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's method)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class HandlerRunner:
    """Start calls of ``handler`` on ``threads`` threads, or on one event loop if it is async."""

    def __init__(self, handler: HandlerCall, threads: int, *, name: str = "kmq-handler") -> None:
        self.handler = handler
        #: Ends of calls, in the order they ended.
        self.ends: queue.SimpleQueue[CallEnd] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._async = is_async_handler(handler.handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Calls running on the event loop (touched on its thread only).
        self._tasks: set[asyncio.Task[None]] = set()
        #: Submitted, not yet started on the event loop; a deque, whose ends are thread-safe.
        self._to_start: deque[Job] = deque()
        self._wake_scheduled = False
        self._threads: list[threading.Thread] = []
        self._closed = False
        if self._async:
            self._loop = asyncio.new_event_loop()
            self._threads.append(
                threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
            )
        else:
            self._threads += [
                threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=True)
                for index in range(threads)
            ]
        for thread in self._threads:
            thread.start()

    #: Calls run beside the loop: :meth:`submit` returns before the call ends.
    inline = False

    def submit(self, message: KmqMessage, attributes: Attributes = None) -> None:
        """Start a call on ``message`` now; its end comes back on :attr:`ends`. With tracing
        on, its ``process`` span carries ``attributes`` too."""
        if self._loop is None:
            self._jobs.put((message, attributes))
            return
        # One wake-up of the event loop per burst of submits, not one per call: each writes to
        # the loop's self-pipe, and at 1,000 calls at once those writes took most of the time of
        # the thread that submits.
        self._to_start.append((message, attributes))
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon_threadsafe(self._start_submitted)

    def take_ends(self, timeout_s: float) -> list[CallEnd]:
        """The ends ready now, all at once; if none, wait up to ``timeout_s`` for one."""
        try:
            ends = [self.ends.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                ends.append(self.ends.get_nowait())
            except queue.Empty:
                return ends

    def close(self) -> None:
        """Stop taking calls; calls still running are abandoned (their threads are daemons)."""
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            for _ in self._threads:
                self._jobs.put(None)
            return
        asyncio.run_coroutine_threadsafe(self._cancel_running(), self._loop)
        self._threads[0].join(timeout=CANCEL_WAIT_S + 1.0)
        if not self._loop.is_running():
            self._loop.close()

    def _start_submitted(self) -> None:
        # On the event loop. Cleared before draining: a submit after this line schedules
        # another wake-up, and one before it is drained here; none is left unstarted.
        self._wake_scheduled = False
        loop = asyncio.get_running_loop()
        while self._to_start:
            task = loop.create_task(self._call_async(*self._to_start.popleft()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cancel_running(self) -> None:
        # On the event loop: each call running is cancelled and gets CANCEL_WAIT_S to end, then
        # the loop stops. Stopping at once left every cancellation undelivered and each task
        # pending, which asyncio reports as "Task was destroyed but it is pending!" when it is
        # collected: at every stop of a worker with calls running.
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
            for task in pending:  # a call that ignores its cancellation: abandoned, on purpose
                task._log_destroy_pending = False  # type: ignore[attr-defined]
        asyncio.get_running_loop().stop()

    def _serve(self) -> None:
        # One HandlerCall per thread: an awaitable a plain function returns is run on this
        # thread's own event loop, never on another thread's.
        call = HandlerCall(self.handler.handler, group=self.handler.group)
        try:
            while (job := self._jobs.get()) is not None:
                self.ends.put(_end(call, *job))
        finally:
            call.close()

    async def _call_async(self, message: KmqMessage, attributes: Attributes) -> None:
        error: BaseException | None = None
        result: object = None
        try:
            if tracing_active():
                record = (message.topic, message.partition, message.offset)
                with processing(record, message.headers, self.handler.group, attributes):
                    result = await self.handler.handler(message)  # type: ignore[misc]
            else:
                result = await self.handler.handler(message)  # type: ignore[misc]
        except asyncio.CancelledError as exc:
            if self._closed:
                raise  # the worker stops: this call's end no longer matters
            error = exc  # the handler's own: a failure like any other, never a silent end
        except BaseException as exc:  # reported, not raised: the loop thread decides
            error = exc
        self.ends.put(CallEnd(message, error, result))


class InlineRunner:
    """Run each call on the caller's thread (the loop's) as it is submitted; for one call at a
    time, where a thread would only add a hand-off each way.

    While a call runs the loop runs nothing else: it neither polls nor extends visibility (a
    call that outlives the visibility timeout is redelivered while it runs), and a stop
    request is seen when the call returns (``kmq worker`` ends a process whose call is still
    running ``--drain-timeout`` after the request: :mod:`kmq_dagster.cli.stop_deadline`).
    """

    #: :meth:`submit` returns after the call has ended; its end is ready at once.
    inline = True

    def __init__(self, handler: HandlerCall) -> None:
        self.handler = handler
        self._ends: list[CallEnd] = []

    def submit(self, message: KmqMessage, attributes: Attributes = None) -> None:
        """Run the call on ``message`` now; its end is in the next :meth:`take_ends`."""
        try:
            self.handler(message, attributes)
        except BaseException as exc:  # reported, not raised: the loop decides
            self._ends.append(CallEnd(message, exc))
        else:
            self._ends.append(CallEnd(message, None))

    def take_ends(self, timeout_s: float) -> list[CallEnd]:
        """The ends of the calls run since the last take (nothing runs meanwhile: no wait)."""
        ends, self._ends = self._ends, []
        return ends

    def close(self) -> None:
        """Nothing to stop: no call runs once :meth:`submit` has returned."""


def _end(call: Any, message: KmqMessage, attributes: Attributes) -> CallEnd:
    """Run one call; its end, with what it returned (Spark writes that to its sink)."""
    try:
        result = call(message, attributes)
    except BaseException as exc:  # reported, not raised: the loop thread decides
        return CallEnd(message, exc)
    return CallEnd(message, None, result)
