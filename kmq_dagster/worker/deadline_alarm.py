"""A deadline the worker loop notices without reading the clock once a message.

At ``N`` = 1 the loop runs a fetch's calls one after another and must extend the messages
waiting behind them once a third of the visibility timeout has passed. Reading the clock after
every call cost a no-op handler's loop about a tenth of its time a message (a clock read is a
system call on some virtual machines). A :class:`DeadlineAlarm` has a thread of its own wait
for the deadline; the loop only looks whether :attr:`~DeadlineAlarm.rung` is non-empty (a list's
truth: no call), and reads the clock when it is.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from kmq_dagster.kafka.clients import wall_clock_ms


class DeadlineAlarm:
    """Makes :attr:`rung` non-empty once the deadline given to :meth:`arm` has passed.

    Rings late by a thread wake-up at most, never early. :meth:`close` ends its thread.
    """

    def __init__(self, *, thread_name: str) -> None:
        #: Non-empty once the armed deadline passed.
        self.rung: list[bool] = []
        self._deadline_s = math.inf
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._watch, name=thread_name, daemon=True)
        self._thread.start()

    def arm(self, in_ms: float) -> None:
        """Ring ``in_ms`` milliseconds from now (at once if not positive); clears a ring."""
        deadline_s = time.monotonic() + in_ms / 1000
        with self._changed:
            self.rung.clear()
            sooner = deadline_s < self._deadline_s
            self._deadline_s = deadline_s
            if sooner:  # a later one is seen when the thread wakes for the earlier one
                self._changed.notify()

    def close(self) -> None:
        """End the alarm's thread."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                left_s = self._deadline_s - time.monotonic()
                if left_s > 0:
                    self._changed.wait(None if left_s == math.inf else left_s)
                    continue
                self.rung.append(True)
                self._deadline_s = math.inf  # rung once: the next arm sets the next one


class EveryMessage:
    """The alarm of a loop on a clock other than the real one (a test's fake): always rung,
    so the loop reads that clock after every call, as it did before alarms."""

    rung: list[bool] = [True]  # never changed

    def arm(self, in_ms: float) -> None:
        """Nothing to arm: the loop looks at the clock after every call anyway."""

    def close(self) -> None:
        """Nothing to end."""


def alarm_for(clock_ms: Callable[[], int], *, thread_name: str) -> DeadlineAlarm | EveryMessage:
    """The alarm a loop on ``clock_ms`` looks at once a message: a :class:`DeadlineAlarm` on the
    real clock, :class:`EveryMessage` on any other (which the alarm's thread cannot follow)."""
    if clock_ms is wall_clock_ms:
        return DeadlineAlarm(thread_name=thread_name)
    return EveryMessage()
