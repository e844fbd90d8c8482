"""Calling the user's function on up to ``N`` messages of a chunk at once, in the job's ordering
(invariant 10), for functions that wait on I/O.

A Spark task processes its chunks one after the other; within a chunk (records of one
partition, in offset order) :class:`ConcurrentCalls` starts what the
:class:`~kmq_dagster.core.ordering.LaneScheduler` lets start: ``key``, never two messages of one
key at once and one key's messages in offset order (a message without a key is a lane of its
own); ``partition``, one at a time (a chunk is one partition: today's sequential calls);
``unordered``, up to ``N``. An ``async def`` function runs as tasks on one event loop per Spark
task; a sync function runs on a thread pool of ``N``. Both are coordinated from the task's own
thread, which alone touches the scheduler.

What comes back is today's :class:`~kmq_dagster.spark.process.Outcome`: the results of the
chunk's first ``done`` messages, in offset order. When the batch's time is up no call starts;
the calls running finish, and the chunk is done up to its first message that did not end.
Messages after it are read again by the next batch, like the rest of a chunk today, so a call
that ended out of order there may run twice (at-least-once; never lost). A failure takes
today's path: its retry or dead-letter copy is written by the task; in ``key`` order the key's
later messages of the chunk start after it ended, and may run before its retried copy does.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import NamedTuple, Protocol

from kmq_dagster.core.ordering import LaneScheduler, Ordering
from kmq_dagster.errors import ConfigError, HandlerResultError
from kmq_dagster.spark.message import SparkMessage
from kmq_dagster.spark.process import FAILED, Function, MetadataCheck, Outcome, call_function
from kmq_dagster.tracing import ORDERING_WAIT_MS, processing, tracing_active
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import is_async_handler

log = logging.getLogger(__name__)

__all__ = ["ChunkCaller", "ConcurrentCalls", "check_concurrency", "chunk_caller"]

#: Stands in for the end of a message whose call has not ended (or not started).
_PENDING = object()


class ChunkCaller(Protocol):
    """Calls a function over a chunk until ``time.monotonic()`` passes ``stop_at``."""

    def __call__(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None
    ) -> Outcome: ...

    def close(self) -> None: ...


def check_concurrency(
    concurrency: int, ordering: Ordering | str, *, function: Function | None, transform: bool
) -> Ordering:
    """Validate a job's concurrency settings on the driver; returns the ordering.

    Raises:
        ConfigError: ``concurrency`` is below 1, ``ordering`` is not an :class:`Ordering`,
            concurrency or an ordering is asked of a DataFrame transform (it runs on whole
            batches, not per message), or ``function`` is a generator function (its body would
            never run).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}", setting="concurrency")
    try:
        order = Ordering(ordering)
    except ValueError:
        choices = ", ".join(o.value for o in Ordering)
        raise ConfigError(
            f"ordering {ordering!r} is none of {choices}", setting="ordering"
        ) from None
    if transform and (concurrency != 1 or order is not Ordering.PARTITION):
        raise ConfigError(
            "concurrency and ordering apply to per-message functions only: a DataFrame "
            "transform runs once per batch, in parallel across Spark's partitions",
            setting="concurrency",
        )
    if function is not None:
        HandlerCall(function)  # refuses a generator function
        if concurrency > 1 and order is Ordering.PARTITION:
            log.warning(
                "concurrency %d in partition order runs one call at a time: a Spark task "
                "processes one partition's chunk at a time; use ordering key or unordered",
                concurrency,
            )
    return order


def chunk_caller(
    function: Function, concurrency: int, ordering: Ordering, group: str | None = None
) -> ChunkCaller:
    """Today's sequential calls for a sync function at ``concurrency`` 1 (or in partition
    order, which is the same within a chunk); :class:`ConcurrentCalls` otherwise, and for every
    ``async def`` function (so its coroutines are awaited, never taken for results). With
    tracing on, each call is a ``process`` span of ``group``."""
    if is_async_handler(function) or (concurrency > 1 and ordering is not Ordering.PARTITION):
        return ConcurrentCalls(function, concurrency, ordering, group=group)
    return _SequentialCalls(function, group)


class _SequentialCalls:
    def __init__(self, function: Function, group: str | None) -> None:
        self.function = function
        self.group = group

    def __call__(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None
    ) -> Outcome:
        return call_function(self.function, messages, stop_at, check, group=self.group)

    def close(self) -> None:
        pass


class ConcurrentCalls:
    """``function`` on up to ``concurrency`` messages of a chunk at once, in ``ordering``; one
    per Spark task (its event loop and thread pool live until :meth:`close`).

    With tracing on, each call is a ``process`` span of ``group`` in its message's trace,
    current while the function runs (on the event loop or in the pool's thread), with
    ``kmq.ordering.wait_ms``: how long the message waited from its chunk's start to its call.
    """

    def __init__(
        self,
        function: Function,
        concurrency: int,
        ordering: Ordering,
        *,
        group: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.function = function
        #: The consumer group calls are made for (named in their trace spans).
        self.group = group
        self.concurrency = concurrency
        self.ordering = Ordering(ordering)
        self._async = is_async_handler(function)
        self._loop = asyncio.new_event_loop()
        self._pool: ThreadPoolExecutor | None = None
        if not self._async:
            self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="kmq-spark-call")

    def __call__(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None = None
    ) -> Outcome:
        """The chunk's outcome; at least its first message is always done."""
        ends = self._loop.run_until_complete(self._run(messages, stop_at, check))
        return _outcome(messages, ends)

    def close(self) -> None:
        """Free the thread pool and the event loop (every call ended with its chunk)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.close()

    async def _run(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None
    ) -> list[object]:
        """Each message's end: its result, an exception, a reason to dead-letter it, or
        ``_PENDING`` for the messages the stop left unstarted."""
        scheduler: LaneScheduler[int] = LaneScheduler(self.ordering, self.concurrency)
        for index, message in enumerate(messages):
            scheduler.add(index, (message.topic, message.partition), message.offset, message.key)
        ends: list[object] = [_PENDING] * len(messages)
        running: dict[asyncio.Future[object], int] = {}
        starting = True
        # Looked up once per chunk, not per call; the chunk's start is when its waits begin.
        traced, chunk_started = tracing_active(), time.monotonic()
        try:
            while True:
                # Started before the clock is read: the chunk's first message always runs.
                while starting and (startable := scheduler.take(0)):
                    for index in startable:
                        problem = check(messages[index]) if check is not None else None
                        if problem is not None:  # dead-lettered without a call
                            ends[index] = _Refused(problem)
                            scheduler.finish(index)
                        elif traced:
                            wait_ms = round((time.monotonic() - chunk_started) * 1000)
                            call = self._traced_call(messages[index], wait_ms)
                            running[asyncio.ensure_future(call)] = index
                        else:
                            running[asyncio.ensure_future(self._call(messages[index]))] = index
                if not running:
                    return ends
                ended, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in ended:
                    index = running.pop(future)
                    error = future.exception()
                    if error is not None and not isinstance(error, Exception):
                        raise error  # KeyboardInterrupt and the like end the task, as today
                    ends[index] = future.result() if error is None else error
                    scheduler.finish(index)
                starting = starting and time.monotonic() <= stop_at
        finally:
            for future in running:
                future.cancel()
            if running:
                await asyncio.wait(running)

    async def _traced_call(self, message: SparkMessage, wait_ms: int) -> object:
        """:meth:`_call` inside its ``process`` span (``kmq_dagster.tracing``)."""
        record = (message.topic, message.partition, message.offset)
        with processing(record, message.headers, self.group, {ORDERING_WAIT_MS: wait_ms}):
            return await self._call(message, in_context=True)

    async def _call(self, message: SparkMessage, *, in_context: bool = False) -> object:
        if self._async:
            call: Callable[[SparkMessage], Awaitable[object]] = self.function  # type: ignore[assignment]
            return await call(message)
        if in_context:  # the pool's thread runs in this task's context: the span is current
            in_span = partial(contextvars.copy_context().run, self.function, message)
            result = await self._loop.run_in_executor(self._pool, in_span)
        else:
            result = await self._loop.run_in_executor(self._pool, self.function, message)
        if inspect.isawaitable(result):  # a plain function that returned a coroutine
            return await result
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            name = getattr(self.function, "__qualname__", type(self.function).__name__)
            raise HandlerResultError(f"function {name} returned a generator: none of its work ran")
        return result


def _outcome(messages: list[SparkMessage], ends: list[object]) -> Outcome:
    """The chunk up to its first message that did not end, as :func:`call_function` gives it."""
    from kmq_dagster.kafka.retry_router import failure_of

    outcome = Outcome()
    append, failed = outcome.results.append, outcome.failed
    for message, end in zip(messages, ends, strict=True):
        if end is _PENDING:
            break
        if isinstance(end, Exception):
            append(FAILED)
            failed.append((message, failure_of(end)))
        elif isinstance(end, _Refused):
            append(FAILED)
            failed.append((message, end.reason))
        else:
            append(end)
    return outcome


class _Refused(NamedTuple):
    """A message the metadata check dead-letters without a call, and why."""

    reason: str
