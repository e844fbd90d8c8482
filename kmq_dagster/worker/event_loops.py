"""The event loop that runs ``async def`` handlers: uvloop's where it is installed.

In the I/O benchmark (an ``async def`` handler awaiting 20 ms, concurrency 1,000) most of the
worker thread's time is asyncio's own machinery: timers, callbacks, futures, a task's steps.
uvloop runs that machinery in C; it took 16% less CPU a message there (docs/benchmarks.md,
stop 60). kmq installs it on Linux and macOS with Dagster's web server (``uvicorn[standard]``).

``KMQ_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop if it imports, else asyncio's own),
``uvloop`` (an error if it is missing) or ``asyncio`` (the standard library's, for a handler
that needs something uvloop does differently).
"""

from __future__ import annotations

import asyncio
import os

from kmq_dagster.errors import ConfigError

#: The environment variable that chooses the event loop.
EVENT_LOOP_ENV = "KMQ_EVENT_LOOP"
#: Its values.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_choice() -> str:
    """``KMQ_EVENT_LOOP``'s value, checked: what a worker checks as it is made, so that a typo
    is one error at start rather than a failure of the first call that needs a loop.

    Raises:
        ConfigError: it is not one of :data:`EVENT_LOOPS`.
    """
    choice = os.environ.get(EVENT_LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in EVENT_LOOPS:
        raise ConfigError(
            f"{EVENT_LOOP_ENV} must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}",
            setting=EVENT_LOOP_ENV,
        )
    return choice


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``KMQ_EVENT_LOOP`` chooses (not made current).

    Raises:
        ConfigError: ``KMQ_EVENT_LOOP`` is not one of :data:`EVENT_LOOPS`, or is ``uvloop``
            and uvloop is not installed.
    """
    choice = event_loop_choice()
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError(
                    f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed: pip install uvloop",
                    setting=EVENT_LOOP_ENV,
                ) from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
