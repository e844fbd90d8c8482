"""How long fetched messages waited for their call to start, as Prometheus buckets.

The worker observes each wait on its loop's thread, as its call starts or, when a handler
thread started it, at the loop's next wait for ends (a lock keeps concurrent observations
whole); the metrics server reads the counts on another thread when scraped. Counts only grow
and each is one list slot, so a scrape sees every bucket at most one observation behind, and
:meth:`WaitHistogram.cumulative` derives the total from the same counts it returns (the
``+Inf`` bucket always equals the count reported).
"""

from __future__ import annotations

import bisect
import threading
from itertools import repeat

#: Upper bounds of the buckets in seconds: a wait is a poll's hop (ms) up to a hot key's queue
#: or a breaker's cooldown (minutes).
WAIT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class WaitHistogram:
    """Waits in seconds counted per bucket (``le`` bounds), plus their sum."""

    def __init__(self, bounds_s: tuple[float, ...] = WAIT_BUCKETS_S) -> None:
        self.bounds_s = bounds_s
        #: One count per bound, then one for waits above the last bound.
        self._counts = [0] * (len(bounds_s) + 1)
        self.sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, wait_s: float) -> None:
        index = bisect.bisect_left(self.bounds_s, wait_s)
        with self._lock:
            self._counts[index] += 1
            self.sum_s += wait_s

    def observe_all(self, waits_s: list[float]) -> None:
        """:meth:`observe` each of ``waits_s``, taking the lock once (a loop starting a fetch's
        calls observes them together)."""
        indices = list(map(bisect.bisect_left, repeat(self.bounds_s), waits_s))
        total_s = sum(waits_s)
        with self._lock:
            counts = self._counts
            for index in indices:
                counts[index] += 1
            self.sum_s += total_s

    @property
    def count(self) -> int:
        return sum(self._counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, waits at most le)`` per bucket, ending with ``("+Inf", count)``."""
        counts = list(self._counts)  # one copy: every bucket from the same moment
        total = 0
        buckets: list[tuple[str, int]] = []
        for bound, count in zip((*map(str, self.bounds_s), "+Inf"), counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets
