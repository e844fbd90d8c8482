"""Circuit breaker against error floods: a pure state machine driven by outcomes and a clock.

CLOSED: messages flow. It opens when, over the last ``window_ms``, at least ``min_calls``
calls were made and the share that failed reached ``error_rate``, or when
``consecutive_failures`` calls failed in a row.
OPEN: nothing is processed (the worker stops fetching) until ``cooldown_ms`` has passed.
HALF_OPEN: up to ``probes`` messages are let through. If they all succeed the breaker closes;
one failure reopens it with the cooldown multiplied by ``cooldown_multiplier`` (at most
``max_cooldown_ms``). Closing resets the cooldown.

Every change of state is returned as a :class:`Transition`, for the audit log and alerting.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from kmq_dagster.core.durations import MAX_DURATION_MS
from kmq_dagster.errors import ConfigError


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """When the breaker opens, how long it stays open, how it probes."""

    window_ms: int = 30_000
    min_calls: int = 20
    error_rate: float = 0.5
    consecutive_failures: int = 10
    cooldown_ms: int = 10_000
    cooldown_multiplier: float = 2.0
    max_cooldown_ms: int = 300_000
    probes: int = 3

    def __post_init__(self) -> None:
        """Refuse settings under which the breaker could not work as documented.

        Raises:
            ConfigError: a setting is out of range, NaN or infinite.
        """
        for name in ("window_ms", "cooldown_ms", "max_cooldown_ms"):
            if not 0 < getattr(self, name) <= MAX_DURATION_MS:
                raise ConfigError(
                    f"breaker {name} must be more than 0 and at most {MAX_DURATION_MS} ms, "
                    f"got {getattr(self, name)}"
                )
        if not 0 < self.error_rate <= 1:  # also refuses NaN: every comparison with it is false
            raise ConfigError(f"breaker error_rate must be in (0, 1], got {self.error_rate}")
        for name in ("min_calls", "consecutive_failures", "probes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"breaker {name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.cooldown_multiplier < math.inf:
            raise ConfigError(
                f"breaker cooldown_multiplier must be a finite number >= 1, "
                f"got {self.cooldown_multiplier}"
            )
        if self.max_cooldown_ms < self.cooldown_ms:
            raise ConfigError(
                f"breaker max_cooldown_ms ({self.max_cooldown_ms}) must not be below "
                f"cooldown_ms ({self.cooldown_ms})"
            )


@dataclass(frozen=True)
class Transition:
    """One change of state, with the evidence for it."""

    from_state: State
    to_state: State
    at_ms: int
    #: Failed share of the calls in the window when it happened.
    error_rate: float
    #: Calls in the window when it happened.
    window_calls: int
    reason: str


class CircuitBreaker:
    """The breaker of one topic and group in one process. Not thread-safe: one caller."""

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self.state = State.CLOSED
        self.cooldown_ms = self.config.cooldown_ms
        #: When the breaker opened last (ms); OPEN lasts until ``opened_at_ms + cooldown_ms``.
        self.opened_at_ms = 0
        self._outcomes: deque[tuple[int, bool]] = deque()
        self._failures_in_window = 0
        self._consecutive_failures = 0
        self._probes_started = 0
        self._probes_succeeded = 0

    # -- questions ---------------------------------------------------------------------------

    def allows(self) -> bool:
        """May one more message be processed now? (Call :meth:`advance` first.)"""
        if self.state is State.CLOSED:
            return True
        if self.state is State.HALF_OPEN:
            return self._probes_started < self.config.probes
        return False

    def reopens_at_ms(self) -> int:
        """When an OPEN breaker lets probes through."""
        return self.opened_at_ms + self.cooldown_ms

    def window(self, now_ms: int) -> tuple[float, int]:
        """(failed share, calls) over the sliding window ending at ``now_ms``."""
        self._forget_before(now_ms - self.config.window_ms)
        calls = len(self._outcomes)
        return (self._failures_in_window / calls if calls else 0.0), calls

    # -- events ------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> Transition | None:
        """Let time pass: an OPEN breaker whose cooldown is over becomes HALF_OPEN."""
        if self.state is State.OPEN and now_ms >= self.reopens_at_ms():
            self._probes_started = self._probes_succeeded = 0
            return self._move(State.HALF_OPEN, now_ms, "cooldown over: probing")
        return None

    def started(self) -> None:
        """A message allowed by :meth:`allows` is being processed."""
        if self.state is State.HALF_OPEN:
            self._probes_started += 1

    def release(self) -> None:
        """A message started with :meth:`started` ended in an outcome that does not count (an
        error the retry policy treats as fatal): it gives its probe back, records nothing."""
        if self.state is State.HALF_OPEN:
            self._probes_started = max(0, self._probes_started - 1)

    def record(self, ok: bool, now_ms: int) -> Transition | None:
        """The outcome of one processed message."""
        self._outcomes.append((now_ms, ok))
        self._failures_in_window += not ok
        self._consecutive_failures = 0 if ok else self._consecutive_failures + 1
        if self.state is State.HALF_OPEN:
            return self._after_probe(ok, now_ms)
        if self.state is State.CLOSED and not ok:
            return self._maybe_open(now_ms)
        return None

    def adopt(self, state: State, opened_at_ms: int, cooldown_ms: int) -> None:
        """Take over a state another process of the group decided (shared through a store)."""
        self.state = state
        self.opened_at_ms = opened_at_ms
        self.cooldown_ms = cooldown_ms
        if state is State.HALF_OPEN:
            self._probes_started = self._probes_succeeded = 0

    # -- internals ---------------------------------------------------------------------------

    def _maybe_open(self, now_ms: int) -> Transition | None:
        rate, calls = self.window(now_ms)
        config = self.config
        if self._consecutive_failures >= config.consecutive_failures:
            reason = f"{self._consecutive_failures} consecutive failures"
        elif calls >= config.min_calls and rate >= config.error_rate:
            reason = f"error rate {rate:.0%} over {calls} calls in {config.window_ms} ms"
        else:
            return None
        self.opened_at_ms = now_ms
        return self._move(State.OPEN, now_ms, reason)

    def _after_probe(self, ok: bool, now_ms: int) -> Transition | None:
        if not ok:
            # min() before int(): a huge multiplier makes the product infinite, never an error.
            grown_ms = self.cooldown_ms * self.config.cooldown_multiplier
            self.cooldown_ms = int(min(grown_ms, self.config.max_cooldown_ms))
            self.opened_at_ms = now_ms
            return self._move(State.OPEN, now_ms, f"probe failed; cooldown {self.cooldown_ms} ms")
        self._probes_succeeded += 1
        if self._probes_succeeded < self.config.probes:
            return None
        self.cooldown_ms = self.config.cooldown_ms
        self._outcomes.clear()  # a fresh window: the outage's failures no longer count
        self._failures_in_window = 0
        return self._move(State.CLOSED, now_ms, f"{self._probes_succeeded} probes succeeded")

    def _move(self, to_state: State, now_ms: int, reason: str) -> Transition:
        rate, calls = self.window(now_ms)
        transition = Transition(self.state, to_state, now_ms, rate, calls, reason)
        self.state = to_state
        return transition

    def _forget_before(self, oldest_ms: int) -> None:
        while self._outcomes and self._outcomes[0][0] < oldest_ms:
            _, ok = self._outcomes.popleft()
            self._failures_in_window -= not ok
