"""Calling a handler so that its work has run when the call returns: an acknowledgement after
a call that only built a coroutine or a generator would drop the message unprocessed
(invariant 1).

* ``async def`` handlers run to completion on the worker's event loop, one at a time (an
  awaitable that a plain function returns is awaited there too);
* generator functions are refused when the worker starts (their body runs only when iterated);
  a generator returned at run time fails the message with :class:`HandlerResultError`, which
  the retry policy sends to the DLQ with that reason.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kmq_dagster.errors import ConfigError, HandlerResultError
from kmq_dagster.tracing import processing, tracing_active
from kmq_dagster.worker.event_loops import event_loop_choice, new_event_loop

Handler = Callable[[Any], object]


def _describe(handler: Handler) -> str:
    return getattr(handler, "__qualname__", None) or type(handler).__name__


def _is_generator_function(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's method)
    return any(
        inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f) for f in (handler, call)
    )


class HandlerCall:
    """``handler`` wrapped so that calling it runs its work; :meth:`close` frees its loop.

    With tracing on (``kmq_dagster.tracing``), each call is a ``process`` span of ``group``.

    Raises:
        ConfigError: ``handler`` is a generator function (sync or async), or
            ``KMQ_EVENT_LOOP`` is not a known event loop.
    """

    def __init__(self, handler: Handler, *, group: str | None = None) -> None:
        if _is_generator_function(handler):
            raise ConfigError(
                f"handler {_describe(handler)} is a generator function: calling it runs none of "
                "its body; return (or `async def` and await) instead of yield",
                setting="handler",
            )
        event_loop_choice()  # a bad KMQ_EVENT_LOOP is an error here, not at a first await
        self.handler = handler
        #: The consumer group calls are made for (named in their trace spans).
        self.group = group
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, message: Any, attributes: Mapping[str, Any] | None = None) -> object:
        """Call the handler on ``message``; with tracing on, inside a ``process`` span that
        carries ``attributes`` too (e.g. how long the message waited to start)."""
        if tracing_active():
            record = (message.topic, message.partition, message.offset)
            with processing(record, message.headers, self.group, attributes):
                return self.run(message)
        return self.run(message)

    def run(self, message: Any) -> object:
        """Call the handler on ``message`` with no span (for a caller that checked tracing)."""
        result = self.handler(message)
        if result is None:  # most handlers return nothing: one check per message, not three
            return None
        return self.settle(result)

    def hot_call(self) -> tuple[Handler, Callable[[object], object]]:
        """What a loop calling once per message calls instead of :meth:`run`, checking
        tracing once rather than per call: the handler, and what a result that is not ``None``
        still needs (an awaitable, a generator). Without tracing, the user's function itself and
        :meth:`settle`, one Python frame less per message than :meth:`run`; with it, the span
        call, which settles its result itself."""
        if tracing_active():
            return self, _as_is
        return self.handler, self.settle

    def settle(self, result: object) -> object:
        """What a call's return value still needs for its work to have run: an awaitable is
        awaited (on this call's own event loop) and its result returned; a generator is refused.
        For callers that call :attr:`handler` themselves, in a loop too hot for a span check per
        call (``None`` needs nothing: they may skip this for it).

        Raises:
            HandlerResultError: ``result`` is a generator (sync or async): none of its work ran.
        """
        if inspect.isawaitable(result):
            return self._run(result)
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            if inspect.isgenerator(result):
                result.close()
            raise HandlerResultError(
                f"handler {_describe(self.handler)} returned a generator: none of its work ran"
            )
        return result

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _run(self, awaitable: Any) -> object:
        if self._loop is None:
            self._loop = new_event_loop()
        coroutine: Coroutine[Any, Any, object] = _await(awaitable)
        return self._loop.run_until_complete(coroutine)


def _as_is(result: object) -> object:
    return result


async def _await(awaitable: Any) -> object:
    return await awaitable
