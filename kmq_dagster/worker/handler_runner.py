"""Runs handler calls for the worker loop (and Spark's chunk caller) and reports their ends.

* :class:`InlineRunner` (one call at a time) runs each call on the loop's own thread, at once:
  no thread, no queue, no hand-off.
* :class:`EventLoopRunner` runs an ``async def`` handler's calls on tasks of an event loop that
  the caller's thread drives itself while it waits for ends: starting a call is queuing it for
  a task (one that ended a call takes the next at once), its end is a list append, and nothing
  crosses a thread. The calls make progress only
  while the caller waits for ends (the loop waits up to 50 ms at a time, between fetches), so
  a handler that blocks instead of awaiting holds up the whole worker, as it would hold up any
  event loop.
* :class:`ThreadRunner` runs a sync handler's calls on ``N`` daemon threads; their ends are
  taken by the caller's thread only (:meth:`ThreadRunner.take_ends`), so only that thread
  touches the scheduler, the router and the breaker. It also takes *runs*
  (:meth:`ThreadRunner.submit_run`): one lane's messages, called in turn on one thread with no
  hand-off between them; what the caller adds to a run while it goes
  (:meth:`ThreadRunner.extend_run`) is called next on the same thread. Runs of one message
  (``unordered`` order) go over as their jobs alone (:meth:`ThreadRunner.submit_singles`). A
  run stops at its first call that does not return, or once the worker stops, and reports what
  it did not start as :class:`Unstarted`. A run's end wakes a waiting caller only when the
  caller has something to do: a failure, or a lane freed while few jobs wait for a thread.

How many calls run at once is the caller's rule (the
:class:`~kmq_dagster.core.ordering.LaneScheduler`'s in-flight limit): a call starts as soon as
it is submitted (on the event loop: at the caller's next wait for ends).

:meth:`close` does not wait for a call that is still running (threads are daemons; tasks are
cancelled and given a second): a hung handler must not keep a stopped worker alive. Its message
is not acknowledged, so the tracker redelivers it after the visibility timeout (invariant 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.tracing import ORDERING_WAIT_MS, processing, tracing_active
from kmq_dagster.worker.event_loops import new_event_loop
from kmq_dagster.worker.handler_call import HandlerCall

#: Span attributes of one call (``None``: none beyond the message's own).
Attributes = Mapping[str, Any] | None
#: A call of a run: the message, and when it was fetched if this is its first call (its wait
#: from fetch to start is measured as it starts).
RunJob = tuple[KmqMessage, int | None]

#: How long calls cancelled when the runner closes get to end, in seconds.
CANCEL_WAIT_S = 1.0


@dataclass(slots=True)
class CallEnd:
    """One call's end: ``error`` is ``None`` when the handler returned, ``result`` what it
    returned (awaited), which Spark writes to its sink. Not frozen: one is made per message,
    and a frozen dataclass takes four times as long to make (about 0.6 us)."""

    message: KmqMessage
    error: BaseException | None
    result: object = None
    #: A run's first call of the message (its wait from fetch to start is observed already).
    first_call: bool = False


@dataclass(frozen=True)
class Unstarted:
    """The end of a run that was never started, in run order: it stopped at a failure (this
    comes before the failed call's end) or because the worker stops."""

    messages: list[KmqMessage]


@dataclass(slots=True)
class _Alone:
    """A call submitted alone (:meth:`ThreadRunner.submit`): its caller waits for its end."""

    message: KmqMessage
    attributes: Attributes


class Run:
    """Calls one thread of a :class:`ThreadRunner` makes in turn: what is left of them, and
    whether the thread has finished with it (then nothing more joins it)."""

    __slots__ = ("closed", "joinable", "pending")

    def __init__(self, jobs: list[RunJob], *, joinable: bool = False) -> None:
        self.pending: deque[RunJob] = deque(jobs)
        #: :meth:`ThreadRunner.extend_run` may add to it (closing it then takes a lock).
        self.joinable = joinable
        self.closed = False


def is_async_handler(handler: Callable[..., object]) -> bool:
    """``async def`` (a function, a partial, or an object whose ``__call__`` is one)."""
    call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's method)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class ThreadRunner:
    """Start calls of a sync ``handler`` on ``threads`` daemon threads.

    Runs read ``clock_ms`` (the caller's clock) for each first call's wait (observed in
    ``waits`` by the caller's next :meth:`take_ends`), and start no call once ``stop`` is
    set."""

    def __init__(
        self,
        handler: HandlerCall,
        threads: int,
        *,
        name: str = "kmq-handler",
        clock_ms: Callable[[], int] | None = None,
        stop: threading.Event | None = None,
        waits: WaitHistogram | None = None,
    ) -> None:
        self.handler = handler
        #: Where each first call's wait from fetch to start is observed.
        self.waits = waits
        #: Waits (s) of first calls started since the last :meth:`take_ends`: threads append,
        #: the caller observes them. A lock per observation, taken on 100 threads at once,
        #: made threads that lost the GIL inside it block each other (docs/benchmarks.md,
        #: stop 72).
        self._started_waits_s: list[float] = []
        #: Ends of calls, in the order they ended (a run's in its order); threads append,
        #: :meth:`take_ends` takes a prefix (list appends are atomic: no lock).
        self._ends: list[CallEnd | Unstarted] = []
        #: A token per wake of :meth:`take_ends`: see :meth:`_ended`.
        self._wakes: queue.SimpleQueue[None] = queue.SimpleQueue()
        #: What threads take: a run, a run of one message (its job alone: no :class:`Run` for
        #: it), a call submitted alone, or ``None`` (stop).
        self._jobs: queue.SimpleQueue[Run | RunJob | _Alone | None] = queue.SimpleQueue()
        #: Taken to close a run (its thread found nothing left) or to add to it.
        self._runs_lock = threading.Lock()
        #: While more jobs than this wait for a thread, a call's end does not wake the caller.
        self._wake_below = threads // 2
        self._clock_ms = clock_ms
        self._stop = stop or threading.Event()
        #: Messages of runs not to start (their partition was fetched again): a run reaching
        #: one stops there. The caller adds and discards; threads only read it.
        self.cancelled: set[KmqMessage] = set()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=True)
            for index in range(threads)
        ]
        self._closed = False
        for thread in self._threads:
            thread.start()

    #: Calls run beside the caller: :meth:`submit` returns before the call ends.
    inline = False

    def submit(self, message: KmqMessage, attributes: Attributes = None) -> None:
        """Start a call on ``message`` now; its end comes back from :meth:`take_ends`. With tracing
        on, its ``process`` span carries ``attributes`` too."""
        self._jobs.put(_Alone(message, attributes))

    def submit_singles(self, jobs: list[RunJob]) -> None:
        """Each of ``jobs`` as a run of its own (``unordered`` order's runs): its call starts
        on the next free thread, and its end (or its :class:`Unstarted`, if the worker stops
        or its message is cancelled first) comes back from :meth:`take_ends`. Nothing joins
        such a run, and no :class:`Run` is made for it (a fifth of the loop's CPU a message
        at concurrency 100, unordered: docs/benchmarks.md, stop 72)."""
        put = self._jobs.put
        for job in jobs:
            put(job)

    def submit_run(self, run: list[RunJob], *, joinable: bool = False) -> Run:
        """Call ``run``'s messages in turn on one thread, as soon as one is free; each end
        comes back from :meth:`take_ends`, and what the run did not start as one
        :class:`Unstarted`. Returns the run, which :meth:`extend_run` can add to if
        ``joinable``."""
        handle = Run(run, joinable=joinable)
        self._jobs.put(handle)
        return handle

    def extend_run(self, run: Run, jobs: list[RunJob]) -> bool:
        """Add ``jobs`` to the end of ``run`` if it is still going (its thread calls them in
        turn after the rest, with no hand-off through the caller); ``False`` if its thread
        has finished with it: ``jobs`` were not taken."""
        if not run.joinable:
            raise ValueError("this run was not submitted joinable")
        with self._runs_lock:
            if run.closed:
                return False
            run.pending.extend(jobs)
            return True

    def begin(self) -> None:
        """Nothing to do: a call starts on a thread as it is submitted."""

    def take_ends(self, timeout_s: float | None) -> list[CallEnd | Unstarted]:
        """The ends ready now, all at once; if none, wait up to ``timeout_s`` (``None``: as
        long as it takes) until a thread wakes the caller (see :meth:`_ended`)."""
        ends = self._ends
        if not ends:
            # Empty after the wait: an end that woke nobody may have come: taken anyway.
            with contextlib.suppress(queue.Empty):
                self._wakes.get(timeout=timeout_s)
        wakes = self._wakes
        while not wakes.empty():  # this take answers every wake so far
            wakes.get_nowait()
        count = len(ends)
        taken = ends[:count]
        del ends[:count]  # what a thread appends meanwhile stays, for the next take
        self._observe_waits()
        return taken

    def _observe_waits(self) -> None:
        """Observe the waits the threads noted so far, together (one lock, this thread's)."""
        started = self._started_waits_s
        if started and self.waits is not None:
            count = len(started)
            self.waits.observe_all(started[:count])
            del started[:count]  # as with ends: what a thread appends meanwhile stays

    def _ended(self, end: CallEnd | Unstarted, *, wake: bool) -> None:
        """Report ``end``, and wake the caller if ``wake`` (see :meth:`_must_wake`)."""
        self._ends.append(end)
        if wake:
            self._wakes.put(None)

    def _must_wake(self) -> bool:
        """Whether a call that returned, and freed its lane, wakes the caller: only once few
        jobs wait for a thread, so that it hands out more before the threads run out.

        While enough runs are queued the threads keep busy without the caller; waking it for
        every end only made it contend for the GIL with them (at concurrency 100 it woke
        about 40,000 times a second on Parallel Consumer's shape). A failure, a run stopped
        short, or a call submitted alone always wakes it; a run's call that is not its last
        frees nothing, and never does. Unwoken ends wait for the next wake or the caller's
        own timeout (the worker loop's is 50 ms), so only runs use this: a caller that waits
        without a timeout for a call it submitted alone is woken by its end."""
        return self._jobs.qsize() <= self._wake_below

    def close(self) -> None:
        """Stop taking calls; calls still running are abandoned (their threads are daemons)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        self._observe_waits()

    def _serve(self) -> None:
        # One HandlerCall per thread: an awaitable a plain function returns is run on this
        # thread's own event loop, never on another thread's.
        call = HandlerCall(self.handler.handler, group=self.handler.group)
        get, single = self._jobs.get, self._single
        try:
            while (job := get()) is not None:
                if type(job) is tuple:
                    single(call, *job)
                elif type(job) is Run:
                    self._run(call, job)
                else:
                    # One call at a time (with a breaker; Spark): its caller waits for it.
                    self._ended(_end(call, job.message, job.attributes), wake=True)  # type: ignore[union-attr]
        finally:
            call.close()

    def _single(self, call: HandlerCall, message: KmqMessage, fetched_ms: int | None) -> None:
        """A run of one message (:meth:`submit_singles`): :meth:`_run`'s steps for it, without
        a :class:`Run` to keep."""
        if self._stop.is_set() or message in self.cancelled:
            self._ended(Unstarted([message]), wake=True)
            return
        wait_ms = None
        if fetched_ms is not None and (clock_ms := self._clock_ms) is not None:
            wait_ms = max(0, clock_ms() - fetched_ms)
            if self.waits is not None:
                self._started_waits_s.append(wait_ms / 1000)
        try:
            if tracing_active():
                result = call(message, None if wait_ms is None else {ORDERING_WAIT_MS: wait_ms})
            else:
                result = call.handler(message)
                if result is not None:
                    result = call.settle(result)
        except BaseException as exc:  # reported, not raised: the loop thread decides
            self._ended(CallEnd(message, exc, None, fetched_ms is not None), wake=True)
            return
        end = CallEnd(message, None, result, fetched_ms is not None)
        self._ended(end, wake=self._must_wake())

    def _run(self, call: HandlerCall, run: Run) -> None:
        ended, stopped, clock_ms = self._ended, self._stop.is_set, self._clock_ms
        cancelled = self.cancelled
        started_waits_s = self._started_waits_s if self.waits is not None else None
        # One tracing check per run (when unordered, a run is one message: per message).
        traced = tracing_active()
        function, settle = call.handler, call.settle
        pending = run.pending
        while pending:
            message, fetched_ms = pending.popleft()
            if stopped() or (cancelled and message in cancelled):
                ended(Unstarted([message, *self._close(run)]), wake=True)
                return
            wait_ms = None
            if fetched_ms is not None and clock_ms is not None:
                wait_ms = max(0, clock_ms() - fetched_ms)
                if started_waits_s is not None:
                    started_waits_s.append(wait_ms / 1000)
            first_call = fetched_ms is not None
            try:
                if traced:
                    attributes = None if wait_ms is None else {ORDERING_WAIT_MS: wait_ms}
                    result = call(message, attributes)
                else:
                    result = function(message)
                    if result is not None:
                        result = settle(result)
            except BaseException as exc:  # reported, not raised: the loop thread decides
                rest = self._close(run)
                if rest:  # the rest waits for this one's retry (or its copy)
                    ended(Unstarted(rest), wake=False)
                ended(CallEnd(message, exc, None, first_call), wake=True)
                return
            # The run's last call (nothing was added meanwhile) frees its lane.
            last = not pending and (not run.joinable or not self._close(run, only_if_empty=True))
            ended(CallEnd(message, None, result, first_call), wake=last and self._must_wake())

    def _close(self, run: Run, *, only_if_empty: bool = False) -> list[KmqMessage]:
        """End ``run``: nothing more joins it. Returns what it holds that was not started,
        in order (with ``only_if_empty``, closes it only if it holds nothing: a non-empty
        list means it goes on)."""
        if not run.joinable:  # only its thread touches it: no lock
            left = [message for message, _ in run.pending]
            run.pending.clear()
            return left
        with self._runs_lock:
            left = [message for message, _ in run.pending]
            if left and only_if_empty:
                return left
            run.pending.clear()
            run.closed = True
            return left


class EventLoopRunner:
    """Run calls of an ``async def`` ``handler`` on an event loop of its own, driven by the
    caller's thread in :meth:`begin` and :meth:`take_ends` (never by a thread of the
    runner's).

    Calls are run by *callers*: tasks that each take the next submitted call once their last
    one ended, and wait when none is left. A task per call (making one, registering it,
    scheduling its first step) cost 8% more instructions a message in the I/O benchmark
    (docs/benchmarks.md, stop 59). A
    call still starts in a task's fresh context: a caller whose call changed its context
    variables, or left it with a cancellation request, ends after that call, and the next call
    gets a new caller.

    With ``max_calls``, no more than that many calls run at once, and calls submitted beyond
    them wait here: a caller whose call ended takes the next at once, in the same step of
    the event loop, instead of waiting for the worker loop to hand one over (in the I/O
    benchmark, 1,000 calls awaiting 20 ms, a call ended and the next started a whole
    worker-loop step later: docs/benchmarks.md, stop 65). A call submitted with the time its
    message was fetched observes its wait (in ``waits``, read on ``clock_ms``) as it starts.
    Once ``stop`` is set no waiting call starts: :meth:`take_ends` hands each back as an
    :class:`Unstarted`.
    """

    #: Calls run while the caller waits for ends: :meth:`submit` returns before they start.
    inline = False

    def __init__(
        self,
        handler: HandlerCall,
        *,
        max_calls: int | None = None,
        clock_ms: Callable[[], int] | None = None,
        stop: threading.Event | None = None,
        waits: WaitHistogram | None = None,
    ) -> None:
        self.handler = handler
        self._loop = new_event_loop()
        #: The context callers are made in when not from the caller's thread (see _serve).
        self._context = contextvars.copy_context()
        self._max_calls = max_calls
        #: Messages of calls not to start (their partition was fetched again): a caller that
        #: takes one ends it as an :class:`Unstarted`. The worker loop adds and discards.
        self.cancelled: set[KmqMessage] = set()
        self._clock_ms = clock_ms
        self._stop = stop or threading.Event()
        self._waits = waits
        #: Waits of the calls started in this run, observed together when it ends.
        self._started_waits_s: list[float] = []
        #: Calls submitted and not yet taken by a caller, in submission order, each with its
        #: message's fetch time (clock ms) if its wait is to be observed as it starts.
        self._queued: deque[tuple[KmqMessage, Attributes, int | None]] = deque()
        #: Calls submitted and not yet ended.
        self._open = 0
        #: Wakes of callers waiting for a call (the one that waited last is woken first).
        self._idle: list[asyncio.Future[None]] = []
        #: Callers woken or made that have not taken a call yet: one per queued call at most.
        self._waking = 0
        self._callers: set[asyncio.Task[None]] = set()
        self._ends: list[CallEnd | Unstarted] = []
        #: Set by the first end while :meth:`take_ends` waits for one.
        self._waiter: asyncio.Future[None] | None = None
        #: Calls were submitted since the event loop last ran.
        self._unstarted = False
        #: Whether the calls of this run are traced: read once a run, not once a call.
        self._traced = False
        self._closed = False

    def submit(
        self, message: KmqMessage, attributes: Attributes = None, fetched_ms: int | None = None
    ) -> None:
        """Queue the call on ``message``; it starts when :meth:`begin` or :meth:`take_ends`
        next runs the event loop (and a call slot is free). With tracing on, its ``process``
        span carries ``attributes`` too; with ``fetched_ms``, its wait from then to its start
        is observed as it starts (and is the span's ordering wait)."""
        self._queued.append((message, attributes, fetched_ms))
        self._open += 1
        self._unstarted = True

    def begin(self) -> None:
        """Run the calls submitted since the last run up to their first wait (the ones that
        need none end here), so that they wait while the caller goes on with its own work.

        One caller is woken first, and the others only for the calls it left queued: a
        handler that returns without waiting (a no-op, a cache hit) has all of a fetch's calls
        run by that one caller, where waking a caller per call made most of them wake to find
        nothing left (2.7-3.4 us a no-op call through this runner, 100 calls a run; 1.5-2.2 us
        now: docs/benchmarks.md, stop 63). A handler that waits leaves the rest to callers woken
        in the run's next pass: every call still starts in this run."""
        if self._unstarted:
            self._unstarted = False
            self._traced = tracing_active()
            self._wake_callers(1)
            self._loop.call_soon(self._wake_the_rest)
            self._loop.run_forever()
            self._observe_waits()

    def _wake_the_rest(self) -> None:
        """After the first pass: a caller for each call still queued, then stop the run once
        they have started theirs."""
        self._wake_callers(len(self._queued))
        self._loop.call_soon(self._loop.stop)

    def _wake_callers(self, count: int) -> None:
        """Wake (or make) callers until ``count`` of them, at most one per queued call, are on
        their way to a call."""
        queued, idle, callers = len(self._queued), self._idle, self._callers
        most = self._max_calls
        while self._waking < min(count, queued):
            if idle:
                self._waking += 1
                idle.pop().set_result(None)
            elif most is None or len(callers) < most:
                self._waking += 1
                callers.add(self._loop.create_task(self._serve()))
            else:  # every caller is busy: the next to end takes what waits
                return

    def take_ends(self, timeout_s: float | None) -> list[CallEnd | Unstarted]:
        """Run the calls until at least one has ended or ``timeout_s`` has passed (``None``: as
        long as it takes); the ends of that run, all at once. Once ``stop`` is set, each call
        still waiting for a slot comes back at once as an :class:`Unstarted` of its own."""
        if self._queued and self._stop.is_set():
            unstarted = [Unstarted([message]) for message, _, _ in self._queued]
            self._queued.clear()
            self._open -= len(unstarted)
            self._ends.extend(unstarted)
        self.begin()  # calls submitted since the last run start first
        if self._open and not self._ends:
            waiter = self._waiter = self._loop.create_future()
            timer = None if timeout_s is None else self._loop.call_later(timeout_s, _wake, waiter)
            try:
                self._loop.run_until_complete(waiter)
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            self._observe_waits()
        ends, self._ends = self._ends, []
        return ends

    def _observe_waits(self) -> None:
        """Observe the waits of the calls the last run started, together (one lock)."""
        started = self._started_waits_s
        if started and self._waits is not None:
            self._waits.observe_all(started)
        started.clear()

    def close(self) -> None:
        """Cancel the calls still running, give them ``CANCEL_WAIT_S`` to end, and close the
        event loop; a call that ignores its cancellation is abandoned, on purpose."""
        if self._closed:
            return
        self._closed = True
        # Cancelled and allowed to end: closing with them pending made asyncio report "Task
        # was destroyed but it is pending!" when they were collected, at every stop of a
        # worker with calls running.
        callers = list(self._callers)
        for caller in callers:
            caller.cancel()
        if callers:
            _, pending = self._loop.run_until_complete(asyncio.wait(callers, timeout=CANCEL_WAIT_S))
            for caller in pending:
                caller._log_destroy_pending = False  # type: ignore[attr-defined]
        self._loop.close()

    async def _serve(self) -> None:
        """A caller: the queued calls one after another, then wait for more. A call is awaited
        here, not in a coroutine of its own (one frame fewer a call)."""
        task = asyncio.current_task()
        assert task is not None
        fresh = contextvars.copy_context()
        queued, idle, handler = self._queued, self._idle, self.handler.handler
        stopped, clock_ms, cancelled = self._stop.is_set, self._clock_ms, self.cancelled
        started_waits_s = self._started_waits_s
        wake: asyncio.Future[None] | None = None
        try:
            while True:
                self._waking -= 1  # woken (or made): this caller takes calls now
                while queued and not stopped():
                    message, attributes, fetched_ms = queued.popleft()
                    if cancelled and message in cancelled:
                        self._ended(Unstarted([message]))
                        continue
                    if fetched_ms is not None and clock_ms is not None:
                        wait_ms = max(0, clock_ms() - fetched_ms)
                        started_waits_s.append(wait_ms / 1000)
                        if self._traced:
                            attributes = {ORDERING_WAIT_MS: wait_ms}
                    error: BaseException | None = None
                    result: object = None
                    try:
                        if self._traced:
                            result = await self._traced_call(message, attributes)
                        else:
                            result = await handler(message)  # type: ignore[misc]
                    except asyncio.CancelledError as exc:
                        if self._closed:
                            raise  # the worker stops: this call's end no longer matters
                        error = exc  # the handler's own: a failure like any other
                    except BaseException as exc:  # reported, not raised: the caller decides
                        error = exc
                    self._ended(CallEnd(message, error, result))
                    try:  # the same context object's variables compare by identity first
                        clean = not task.cancelling() and contextvars.copy_context() == fresh
                    except Exception:  # a variable set to a value that refuses comparison
                        clean = False
                    if not clean:
                        return  # a later call must not inherit what this one left behind
                wake = self._loop.create_future()
                idle.append(wake)
                await wake
        finally:
            self._left(task, wake)

    def _left(self, caller: asyncio.Task[None], wake: asyncio.Future[None] | None) -> None:
        """``caller`` ends: cancelled while it waited for a call, or after a call that left its
        context unclean (then, if calls wait for a slot, a new caller takes its slot)."""
        self._callers.discard(caller)
        if wake is not None and wake in self._idle:
            self._idle.remove(wake)
        elif self._queued and not self._closed:
            # Made in the runner's own context: a task made here would copy the caller's.
            self._loop.call_soon(
                self._wake_callers, len(self._queued), context=self._context.copy()
            )

    async def _traced_call(self, message: KmqMessage, attributes: Attributes) -> object:
        record = (message.topic, message.partition, message.offset)
        with processing(record, message.headers, self.handler.group, attributes):
            return await self.handler.handler(message)  # type: ignore[misc]

    def _ended(self, end: CallEnd | Unstarted) -> None:
        self._open -= 1
        self._ends.append(end)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def concurrent_runner(
    handler: HandlerCall,
    concurrency: int,
    *,
    name: str = "kmq-handler",
    clock_ms: Callable[[], int] | None = None,
    stop: threading.Event | None = None,
    waits: WaitHistogram | None = None,
) -> ThreadRunner | EventLoopRunner:
    """The runner for calls beside the caller: an event loop for an ``async def`` handler,
    ``concurrency`` threads for a sync one (runs read ``clock_ms``, obey ``stop`` and observe
    ``waits``)."""
    if is_async_handler(handler.handler):
        return EventLoopRunner(
            handler, max_calls=concurrency, clock_ms=clock_ms, stop=stop, waits=waits
        )
    return ThreadRunner(handler, concurrency, name=name, clock_ms=clock_ms, stop=stop, waits=waits)


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

    def begin(self) -> None:
        """Nothing to do: each call ran as it was submitted."""

    def take_ends(self, timeout_s: float | None) -> list[CallEnd]:
        """The ends of the calls run since the last take (nothing runs meanwhile: no wait)."""
        ends, self._ends = self._ends, []
        return ends

    def close(self) -> None:
        """Nothing to stop: no call runs once :meth:`submit` has returned."""


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _end(call: Any, message: KmqMessage, attributes: Attributes) -> CallEnd:
    """Run one call; its end, with what it returned (Spark writes that to its sink)."""
    try:
        result = call(message, attributes)
    except BaseException as exc:  # reported, not raised: the loop thread decides
        return CallEnd(message, exc)
    return CallEnd(message, None, result)
