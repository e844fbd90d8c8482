"""Spacing sends to at most a given rate, with no burst after a pause.

A budget counted from the start (``n`` sends allowed by ``start + n / rate``) lets a slow
start or a stall earn credit that is then spent in a burst: a replay at ``--rate 4`` whose first
dead letters took a second to read sent three copies in the same millisecond and eight within
1.2 s. A downstream protected by the rate sees that burst. So each send is due one interval
after the previous one was due, or after the previous send itself when it came late: lateness is
never made up.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    """Hands out send times ``1 / rate_per_s`` apart.

    Args:
        rate_per_s: sends a second at most (positive).
        clock_s: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, rate_per_s: float, *, clock_s: Callable[[], float] = time.monotonic) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"the rate must be positive, got {rate_per_s}")
        self.interval_s = 1 / rate_per_s
        self._clock_s = clock_s
        self._due_s: float | None = None

    def wait_s(self) -> float:
        """Seconds to wait before the next send (0: send now); the send is then counted.

        Call once per send, and send after waiting what it returns.
        """
        now = self._clock_s()
        due = now if self._due_s is None else self._due_s
        wait = max(0.0, due - now)
        # Sleeping wakes a little late: the next interval runs from when this send was due,
        # so those overshoots do not slow the rate; a send later than that (a stall) starts
        # the next interval from itself, so no credit builds up.
        self._due_s = max(due, now) + self.interval_s
        return wait
