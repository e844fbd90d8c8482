"""Calling the user's function on up to ``N`` messages of a chunk at once, in the job's ordering
(invariant 10), for functions that wait on I/O.

A Spark task processes its chunks one after the other; within a chunk (records of one
partition, in offset order) :class:`ConcurrentCalls` starts what the
:class:`~kmq_dagster.core.ordering.LaneScheduler` lets start: ``key``, never two messages of one
key at once and one key's messages in offset order (a message without a key is a lane of its
own); ``partition``, one at a time (a chunk is one partition: today's sequential calls);
``unordered``, up to ``N``. The calls run on the worker's own call runner
(:func:`~kmq_dagster.worker.handler_runner.concurrent_runner`): an ``async def`` function as
tasks on one event loop per Spark task, run by the task's own thread, a sync function on ``N``
threads, each call through
:class:`~kmq_dagster.worker.handler_call.HandlerCall` (an awaitable it returns is awaited, a
generator refused). They are coordinated from the task's own thread, which alone touches the
scheduler.

What comes back is today's :class:`~kmq_dagster.spark.process.Outcome`: the results of the
chunk's first ``done`` messages, in offset order. When the batch's time is up no call starts;
the calls running finish, and the chunk is done up to its first message that did not end.
Messages after it are read again by the next batch, like the rest of a chunk today, so a call
that ended out of order there may run twice (at-least-once; never lost). A failure takes
today's path: its retry or dead-letter copy is written by the task; in ``key`` order the key's
later messages of the chunk start after it ended, and may run before its retried copy does.
"""

from __future__ import annotations

import logging
import time
from asyncio import CancelledError
from typing import Any, NamedTuple, Protocol, cast

from kmq_dagster.core.ordering import LaneScheduler, Ordering
from kmq_dagster.core.queue_settings import CONCURRENCY
from kmq_dagster.errors import ConfigError
from kmq_dagster.spark.message import SparkMessage
from kmq_dagster.spark.process import FAILED, Function, MetadataCheck, Outcome, call_function
from kmq_dagster.tracing import ORDERING_WAIT_MS, tracing_active
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import (
    CallEnd,
    EventLoopRunner,
    ThreadRunner,
    concurrent_runner,
    is_async_handler,
)

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
        ConfigError: ``concurrency`` is out of bounds (1 to 1024), ``ordering`` is not an
            :class:`Ordering`,
            concurrency or an ordering is asked of a DataFrame transform (it runs on whole
            batches, not per message), or ``function`` is a generator function (its body would
            never run).
    """
    CONCURRENCY.check(concurrency)
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
    """Sequential calls for a sync function at ``concurrency`` 1 (or in partition order, which
    is the same within a chunk); :class:`ConcurrentCalls` otherwise, and for every ``async def``
    function. Both call through the worker's :class:`HandlerCall`: an awaitable is awaited and a
    generator refused, never taken for a result. With tracing on, each call is a ``process``
    span of ``group``."""
    if is_async_handler(function) or (concurrency > 1 and ordering is not Ordering.PARTITION):
        return ConcurrentCalls(function, concurrency, ordering, group=group)
    return _SequentialCalls(function, group)


class _SequentialCalls:
    def __init__(self, function: Function, group: str | None) -> None:
        self.call = HandlerCall(function, group=group)

    def __call__(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None
    ) -> Outcome:
        return call_function(self.call, messages, stop_at, check)

    def close(self) -> None:
        self.call.close()


class ConcurrentCalls:
    """``function`` on up to ``concurrency`` messages of a chunk at once, in ``ordering``; one
    per Spark task. The calls run on the worker's
    runner (:func:`~kmq_dagster.worker.handler_runner.concurrent_runner`: threads, or an event
    loop this task's thread runs for an ``async def`` function), which lives until
    :meth:`close`.

    With tracing on, each call is a ``process`` span of ``group`` in its message's trace,
    current while the function runs, with ``kmq.ordering.wait_ms``: how long the message
    waited from its chunk's start to its call.
    """

    def __init__(
        self,
        function: Function,
        concurrency: int,
        ordering: Ordering,
        *,
        group: str | None = None,
    ) -> None:
        CONCURRENCY.check(concurrency)
        #: Refuses a generator function here, and a generator returned at run time per call.
        self.call = HandlerCall(function, group=group)
        self.concurrency = concurrency
        self.ordering = Ordering(ordering)
        self._runner: ThreadRunner | EventLoopRunner | None = None

    def __call__(
        self, messages: list[SparkMessage], stop_at: float, check: MetadataCheck | None = None
    ) -> Outcome:
        """The chunk's outcome; at least its first message is always done."""
        if self._runner is None:
            self._runner = concurrent_runner(self.call, self.concurrency, name="kmq-spark-call")
        try:
            ends = self._run(self._runner, messages, stop_at, check)
        except BaseException:
            # Calls may still be running: their ends must not be taken for the next chunk's.
            self._runner.close()
            self._runner = None
            raise
        return _outcome(messages, ends)

    def close(self) -> None:
        """Stop the runner's threads (every call ended with its chunk)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def _run(
        self,
        runner: ThreadRunner | EventLoopRunner,
        messages: list[SparkMessage],
        stop_at: float,
        check: MetadataCheck | None,
    ) -> list[object]:
        """Each message's end: its result, an exception, a reason to dead-letter it, or
        ``_PENDING`` for the messages the stop left unstarted."""
        scheduler: LaneScheduler[int] = LaneScheduler(self.ordering, self.concurrency)
        for index, message in enumerate(messages):
            scheduler.add(index, (message.topic, message.partition), message.offset, message.key)
        ends: list[object] = [_PENDING] * len(messages)
        #: Index of each running call's message, by the message object's identity.
        running: dict[int, int] = {}
        starting = True
        # Looked up once per chunk, not per call; the chunk's start is when its waits begin.
        traced, chunk_started = tracing_active(), time.monotonic()
        while True:
            # Started before the clock is read: the chunk's first message always runs.
            while starting and (startable := scheduler.take(0)):
                for index in startable:
                    message = messages[index]
                    problem = check(message) if check is not None else None
                    if problem is not None:  # dead-lettered without a call
                        ends[index] = _Refused(problem)
                        scheduler.finish(index)
                        continue
                    running[id(message)] = index
                    if traced:
                        wait_ms = round((time.monotonic() - chunk_started) * 1000)
                        runner.submit(cast(Any, message), {ORDERING_WAIT_MS: wait_ms})
                    else:
                        runner.submit(cast(Any, message))
            if not running:
                return ends
            for end in cast(list[CallEnd], runner.take_ends(None)):  # no runs: all calls' ends
                index = running.pop(id(end.message))
                error = end.error
                if error is not None and not isinstance(error, (Exception, CancelledError)):
                    raise error  # KeyboardInterrupt and the like end the task, as before
                ends[index] = end.result if error is None else _Raised(error)
                scheduler.finish(index)
            starting = starting and time.monotonic() <= stop_at


def _outcome(messages: list[SparkMessage], ends: list[object]) -> Outcome:
    """The chunk up to its first message that did not end, as :func:`call_function` gives it."""
    from kmq_dagster.kafka.retry_router import failure_of

    outcome = Outcome()
    append, failed = outcome.results.append, outcome.failed
    for message, end in zip(messages, ends, strict=True):
        if end is _PENDING:
            break
        if isinstance(end, _Raised):
            append(FAILED)
            failed.append((message, failure_of(end.error)))
        elif isinstance(end, _Refused):
            append(FAILED)
            failed.append((message, end.reason))
        else:
            append(end)
    return outcome


class _Refused(NamedTuple):
    """A message the metadata check dead-letters without a call, and why."""

    reason: str


class _Raised(NamedTuple):
    """A call that raised (an exception, or the function's own cancellation)."""

    error: BaseException
