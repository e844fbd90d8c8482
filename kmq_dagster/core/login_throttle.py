"""Login throttling: backoff after failed logins, per user name and per client (pure).

Each failed login counts against two keys, the user name tried and the client it came from.
The first :data:`FREE_FAILURES` failures of a key cost nothing; each one after them locks the
key for twice as long as the one before (1 s, 2 s, 4 s, ... up to :data:`MAX_LOCK_MS`). A login
is refused, before any password is hashed, while any of its keys is locked. A success clears
the user's key (not the client's: a client guessing many names keeps its backoff). A key
forgets its failures once it has been quiet for :data:`FORGET_AFTER_MS`.

Memory is bounded: at most :data:`MAX_KEYS` keys are kept, the least recently failed
forgotten first, so a flood of made-up names cannot grow the table without limit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

#: Failures of one key before backoff starts.
FREE_FAILURES = 3
#: The first lock after the free failures, in ms; each further failure doubles it.
FIRST_LOCK_MS = 1_000
#: The longest lock, in ms.
MAX_LOCK_MS = 300_000
#: Quiet time after which a key's failures are forgotten, in ms.
FORGET_AFTER_MS = 3_600_000
#: Most keys remembered at once.
MAX_KEYS = 10_000


@dataclass
class _Failures:
    count: int
    last_ms: int
    locked_until_ms: int


class LoginThrottle:
    """Failed logins by key (``user:NAME``, ``client:ADDRESS``) and the backoff they earn."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def wait_ms(self, keys: Iterable[str], now_ms: int) -> int:
        """How long a login under ``keys`` must still wait (0: it may try now)."""
        waits = [self._locked_until(key, now_ms) - now_ms for key in keys]
        return max([0, *waits])

    def failed(self, keys: Iterable[str], now_ms: int) -> int:
        """Count a failed login under ``keys``; returns the lock it earned, in ms."""
        longest = 0
        for key in keys:
            entry = self._failures.pop(key, None)
            if entry is None or now_ms - entry.last_ms >= FORGET_AFTER_MS:
                entry = _Failures(0, now_ms, now_ms)
            entry.count += 1
            entry.last_ms = now_ms
            over = entry.count - FREE_FAILURES
            if over > 0:
                lock_ms = min(MAX_LOCK_MS, FIRST_LOCK_MS << min(over - 1, 30))
                entry.locked_until_ms = now_ms + lock_ms
                longest = max(longest, lock_ms)
            self._failures[key] = entry
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)
        return longest

    def succeeded(self, key: str) -> None:
        """Forget ``key``'s failures (a user who logged in)."""
        self._failures.pop(key, None)

    def clear(self) -> None:
        """Forget every failure."""
        self._failures.clear()

    def failures(self, key: str) -> int:
        """Failures counted against ``key`` (0 if forgotten)."""
        entry = self._failures.get(key)
        return entry.count if entry else 0

    def _locked_until(self, key: str, now_ms: int) -> int:
        entry = self._failures.get(key)
        if entry is None or now_ms - entry.last_ms >= FORGET_AFTER_MS:
            return 0
        return entry.locked_until_ms


def user_key(name: str) -> str:
    return "user:" + name.strip().casefold()


def client_key(address: str) -> str:
    return "client:" + address
