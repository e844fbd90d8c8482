"""``kmq worker`` at concurrency 1 honours ``--drain-timeout`` even when its handler hangs.

At N = 1 the handler runs on the worker's own thread: a stop request is seen only when the call
returns, so a call that never returns (a lost connection without a timeout, a deadlock) kept the
worker running through SIGTERM and any number of Ctrl-C; only SIGKILL ended it. Here a thread
waits for the stop request, then ``drain_timeout_s`` more: if a call is still running then, the
process says so in one line and exits with the stop's exit code, as a worker at N > 1 does with
the calls it cuts off. The message of that call is left unacknowledged and is redelivered after
its visibility timeout; acknowledgements not yet written are redelivered too (duplicates, never
a loss). A call that ends in time lets the worker stop cleanly, untouched.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def exit_if_still_calling(
    stop: threading.Event,
    finished: threading.Event,
    drain_timeout_s: float,
    calls_in_flight: Callable[[], int],
    exit_code: Callable[[], int],
) -> threading.Thread:
    """Start the thread that ends the process ``drain_timeout_s`` after ``stop`` is set if
    ``finished`` is not set by then and ``calls_in_flight()`` is above 0; returns it."""

    def watch() -> None:
        stop.wait()
        if calls_in_flight():
            log.info("stop requested: the call running has %g s to end", drain_timeout_s)
        if finished.wait(drain_timeout_s) or calls_in_flight() == 0:
            return
        log.warning(
            "a handler call was still running %g s after the stop request (--drain-timeout); "
            "exiting without it: its message is redelivered after its visibility timeout",
            drain_timeout_s,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code())

    thread = threading.Thread(target=watch, name="kmq-stop-deadline", daemon=True)
    thread.start()
    return thread
