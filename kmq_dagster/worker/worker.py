"""The worker: a handler per message, an ack when it returns (what ``kmq worker`` runs).

Examples:
    >>> opened = open_queue(settings, "orders", "billing")              # doctest: +SKIP
    >>> Worker(opened, charge).run(stop_event)                           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable

from kmq_dagster.core.breaker import GroupBreaker
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue_settings import CONCURRENCY
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.worker.garbage_collection import GC_FIRST_THRESHOLD, fewer_collections
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.loop import WorkerLoop, default_max_buffered
from kmq_dagster.worker.loop_types import Handler, LoopConsumer, WorkerStats

__all__ = ["HandlerExit", "LoopConsumer", "Worker", "WorkerStats", "load_handler"]


class HandlerExit(Exception):
    """A handler raised ``SystemExit``: the worker stopped cleanly and passes its code on."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the handler asked to exit with code {code}")
        self.code = code


def load_handler(spec: str) -> Handler:
    """Import ``package.module:function``; the current directory is importable, as with
    ``python -m``.

    Raises:
        ConfigError: malformed spec, module not importable (a syntax error, an exception or
            ``sys.exit()`` while importing it included), or attribute not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(
            f"a handler is named package.module:function, got {spec!r}", setting="handler"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import handler module {module_name!r}: {exc}", setting="handler"
        ) from None
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else "unknown place"
        raise ConfigError(
            f"handler module {module_name!r} has a syntax error ({where}): {exc.msg}",
            setting="handler",
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"importing handler module {module_name!r} raised {type(exc).__name__}: {exc}",
            setting="handler",
        ) from None
    except SystemExit as exc:  # an exit at import is a module that cannot load, said so
        raise ConfigError(
            f"importing handler module {module_name!r} called exit({exc.code!r})",
            setting="handler",
        ) from None
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise ConfigError(f"{module_name} has no callable {attribute!r}", setting="handler")
    return handler  # type: ignore[no-any-return]


class Worker:
    """Handle the opened queue's messages with ``handler`` until stopped.

    Returning acknowledges a message. Raising sends it to its retry topic or the DLQ (errors
    the retry policy calls fatal go straight to the DLQ); it is acknowledged once the copy is
    durable. That holds for any ``BaseException`` (``GeneratorExit`` too) and for an exception
    whose ``str()`` raises (its reason is then a placeholder). ``KeyboardInterrupt`` in a
    handler stops the worker; ``SystemExit`` stops it and :meth:`run` raises
    :class:`HandlerExit` with its code. The message either interrupted is neither
    acknowledged nor lost: its visibility timeout redelivers it.

    With a ``breaker``, handler outcomes feed it (fatal errors are bad input, not an outage,
    and do not count). While it does not allow processing, the worker stops fetching and holds
    the messages it has, extending their visibility; nothing is acknowledged, routed or lost
    meanwhile. A message that fails while the breaker is open (the one that opened it, a failed
    probe) is held too, rather than sent to a retry topic: the outage is not its fault and must
    not use up its retries.

    Args:
        opened: the queue; fatal error types are its retry policy's ``non_retryable``
            (:meth:`OpenedQueue.with_non_retryable` adds some).
        breaker: the group's shared circuit breaker (:meth:`SharedBreaker.for_queue`).
        batch_size: messages per fetch; default ``settings.batch_size``.
        concurrency: handler calls at once. 1 (the default) calls one at a time on the
            worker's own thread, in fetch order per partition. Above 1, a sync handler runs on
            that many threads and an ``async def`` handler as that many tasks on an event loop
            the worker's thread runs while it waits for calls to end (it must await, not block).
            One loop runs every concurrency (:mod:`kmq_dagster.worker.loop` says
            what each ordering keeps, through failures and crashes).
        ordering: ``partition`` (one call per partition at a time), ``key`` (never two calls
            of one key at once, offset order; failures retried in place so later messages of
            the key wait), or ``unordered``.
        max_buffered: messages fetched and not yet started before fetching pauses; default
            ``max(4 * concurrency, 100)`` (at ``concurrency`` 1: one fetch, ``batch_size``).
            Fetches are no larger (``batch_size`` is capped by it), so at most twice as many
            are held.
        drain_timeout_s: with ``concurrency`` above 1, how long a stopping worker waits for
            the calls running; those still running then are left for redelivery. (At 1 the
            call runs on the caller's thread; ``kmq worker`` ends its process if the call is
            still running this long after the stop request.)
        extend_running: with ``concurrency`` above 1, a running call's message has its
            visibility extended like a waiting one's, so a slow call is not redelivered while
            the worker lives (default). ``False``: a call that outlives the visibility timeout
            is redelivered while it runs, as at ``concurrency`` 1 (a hung call cannot hold its
            message, or its key, for ever).
        gc_threshold: the garbage collector's first threshold while the worker runs, if the
            process has a lower one (CPython's default is 700); the last worker to stop puts
            back what it found. Calls in flight keep many short-lived objects alive at once,
            and at 700 the collector ran every few hundred messages
            (:mod:`kmq_dagster.worker.garbage_collection`). ``None`` leaves the collector alone.
    """

    def __init__(
        self,
        opened: OpenedQueue,
        handler: Handler,
        *,
        breaker: GroupBreaker | None = None,
        batch_size: int | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        concurrency: int = 1,
        ordering: Ordering | str = Ordering.PARTITION,
        max_buffered: int | None = None,
        drain_timeout_s: float = 30.0,
        extend_running: bool = True,
        gc_threshold: int | None = GC_FIRST_THRESHOLD,
    ) -> None:
        CONCURRENCY.check(concurrency)
        for name, value in (("max_buffered", max_buffered), ("gc_threshold", gc_threshold)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}", setting=name)
        #: Refuses a generator function now, before joining the group; runs ``async def``
        #: handlers to completion.
        self.handler = HandlerCall(handler, group=opened.queue.group)
        if max_buffered is None and concurrency == 1:
            # One call at a time buffers one fetch, as large as it was before the one loop.
            max_buffered = batch_size or opened.settings.batch_size
        # Bounded memory: a fetch comes in whole, so it is no larger than the buffer.
        limit = max_buffered or default_max_buffered(concurrency)
        batch_size = min(batch_size or opened.settings.batch_size, limit)
        self.consumer = KmqConsumer(opened, batch_size=batch_size, clock_ms=clock_ms)
        self.queue = opened.queue
        self.router = RetryRouter(opened, clock_ms=clock_ms)
        self.breaker = breaker
        self.clock_ms = clock_ms
        self.concurrency = concurrency
        self.ordering = Ordering(ordering)
        self.max_buffered = max_buffered
        self.drain_timeout_s = drain_timeout_s
        self.extend_running = extend_running
        self.gc_threshold = gc_threshold
        #: The counts of the current (or last) :meth:`run`; read from any thread.
        self.stats = WorkerStats()

    def run(
        self,
        stop: threading.Event,
        on_batch: Callable[[WorkerStats], None] | None = None,
    ) -> WorkerStats:
        """Handle messages until ``stop`` is set; then write acks, leave the group, return
        the counts.

        Raises:
            HandlerExit: the handler raised ``SystemExit`` (after the clean stop).
        """
        loop = self._new_loop(stop)
        self.stats = loop.stats
        try:
            with fewer_collections(self.gc_threshold):
                while not stop.is_set():
                    loop.step()
                    if on_batch is not None:
                        on_batch(loop.stats)
                loop.drain(self.drain_timeout_s)
        finally:
            loop.close()
            self.consumer.close()
            self.router.close()
            self.handler.close()
        if loop.exit_code is not None:
            raise HandlerExit(loop.exit_code)
        return loop.stats

    def _new_loop(self, stop: threading.Event) -> WorkerLoop:
        return WorkerLoop(
            self.consumer, self.handler, stop,
            router=self.router, breaker=self.breaker, clock_ms=self.clock_ms,
            concurrency=self.concurrency, ordering=self.ordering, max_buffered=self.max_buffered,
            extend_running=self.extend_running,
        )  # fmt: skip
