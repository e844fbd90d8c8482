"""Circuit breaker against error floods: the one state machine, for workers and the breaker sensor.

CLOSED: messages flow. It opens when, over the last ``window_ms``, at least ``min_calls``
messages were processed and the share that failed reached ``error_rate``, or when
``consecutive_failures`` calls failed in a row (only a caller that sees single calls knows
their order).
OPEN: nothing is processed (workers stop fetching, runs stop between batches) until
``cooldown_ms`` has passed.
HALF_OPEN: up to ``probes`` messages are let through and judged as :class:`Judging` says. If
they pass, the breaker closes with a fresh window and the configured cooldown; if not, it
reopens with the cooldown multiplied by ``cooldown_multiplier`` (at most ``max_cooldown_ms``).

Two kinds of callers feed it. A worker records each handler call (:meth:`CircuitBreaker.record`
with :data:`PER_CALL`); the Dagster breaker sensor sees only what the group did between two
ticks and judges those samples (:func:`judge_samples` with :data:`PER_BATCH`). They differ in
how probes are judged and in their reasons' words, never in the rules.

Every change of state is returned as a :class:`Transition`, for the shared store, the audit log
and alerting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kmq_dagster.core.breaker_config import BreakerConfig, State
from kmq_dagster.core.durations import format_duration_ms

__all__ = [
    "PER_BATCH",
    "PER_CALL",
    "BreakerConfig",
    "CircuitBreaker",
    "Judging",
    "Sample",
    "State",
    "Transition",
    "judge_samples",
]


@dataclass(frozen=True)
class Judging:
    """How a breaker weighs what it sees, which depends on whether it sees calls or batches."""

    #: True: one failed probe reopens the breaker and ``probes`` successes close it (a worker
    #: sees each call). False: the error rate over at least ``probes`` messages decides (a
    #: watcher sees batches, where one ordinary failure among many successes is no outage).
    one_failed_probe_reopens: bool
    #: What one counted unit is called in the reasons.
    unit: str
    #: What counts as a failure, said after an error-rate reason.
    failures_note: str = ""


#: A worker's breaker: it sees one handler call at a time.
PER_CALL = Judging(one_failed_probe_reopens=True, unit="calls")
#: The breaker sensor's: it sees per-tick samples, whose failures are copies to the retry topics.
PER_BATCH = Judging(False, "messages", " (copies to the retry topics)")


@dataclass(frozen=True)
class Sample:
    """What was processed in a span ending at ``at_ms``: one call, or a group's work between two
    sensor ticks."""

    at_ms: int
    processed: int
    failures: int


@dataclass(frozen=True)
class Transition:
    """One change of state, with the evidence for it and the state the store keeps after it."""

    from_state: State
    to_state: State
    at_ms: int
    #: Failed share of the messages judged: the window's, or the probe round's (0 when the
    #: cooldown ended: no message was judged).
    error_rate: float
    #: Messages judged: in the window, or in the probe round (0 when the cooldown ended).
    window_calls: int
    reason: str
    #: When the breaker opened last (ms), after the change.
    opened_at_ms: int
    #: The cooldown (ms) after the change.
    cooldown_ms: int


class GroupBreaker(Protocol):
    """The breaker a worker obeys for its group, one message at a time: may it start one
    (``allows``), it started one (``started``), how it ended (``record``), or that its end does
    not count (``release``, bad input). :class:`kmq_dagster.audit.shared_breaker.SharedBreaker`
    is the one kmq builds (shared through the audit store, or in-process without one); the
    worker imports only this, so it loads no SQL."""

    @property
    def state(self) -> State: ...

    def allows(self, now_ms: int) -> bool: ...

    def started(self) -> None: ...

    def release(self) -> None: ...

    def record(self, ok: bool, now_ms: int) -> None: ...


class CircuitBreaker:
    """The breaker of one topic and group as one caller sees it. Not thread-safe: one caller."""

    def __init__(self, config: BreakerConfig | None = None, judging: Judging = PER_CALL) -> None:
        self.config = config or BreakerConfig()
        self.judging = judging
        self.state = State.CLOSED
        self.cooldown_ms = self.config.cooldown_ms
        #: When the breaker opened last (ms); OPEN lasts until ``opened_at_ms + cooldown_ms``.
        self.opened_at_ms = 0
        self._window: deque[Sample] = deque()
        self._window_processed = 0
        self._window_failures = 0
        self._consecutive_failures = 0
        self._probes_started = 0
        self._probe_processed = 0
        self._probe_failures = 0

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
        """(failed share, messages) over the sliding window ending at ``now_ms``."""
        while self._window and self._window[0].at_ms < now_ms - self.config.window_ms:
            old = self._window.popleft()
            self._window_processed -= old.processed
            self._window_failures -= old.failures
        return _rate(self._window_processed, self._window_failures)

    # -- events ------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> Transition | None:
        """Let time pass: an OPEN breaker whose cooldown is over becomes HALF_OPEN."""
        if self.state is State.OPEN and now_ms >= self.reopens_at_ms():
            self._new_probe_round()
            return self._move(State.HALF_OPEN, now_ms, "cooldown over: probing", (0.0, 0))
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
        self._consecutive_failures = 0 if ok else self._consecutive_failures + 1
        return self.observe((Sample(now_ms, 1, 0 if ok else 1),), now_ms)

    def observe(self, samples: Sequence[Sample], now_ms: int) -> Transition | None:
        """What was processed (oldest first), judged at ``now_ms``: a HALF_OPEN breaker counts
        it for its probe round, a CLOSED one opens if its window now fails too much (a success
        can tip it too: the one that brings a failing window to ``min_calls``)."""
        processed = sum(s.processed for s in samples)
        failures = sum(s.failures for s in samples)
        self._window.extend(samples)
        self._window_processed += processed
        self._window_failures += failures
        if self.state is State.HALF_OPEN:
            self._probe_processed += processed
            self._probe_failures += failures
            return self._judge_probes(now_ms)
        if self.state is State.CLOSED:
            return self._maybe_open(now_ms)
        return None

    def adopt(self, state: State, opened_at_ms: int, cooldown_ms: int) -> None:
        """Take over a state decided elsewhere (another process, through a shared store)."""
        self.state = state
        self.opened_at_ms = opened_at_ms
        self.cooldown_ms = cooldown_ms
        if state is State.HALF_OPEN:
            self._new_probe_round()

    # -- internals ---------------------------------------------------------------------------

    def _new_probe_round(self) -> None:
        self._probes_started = self._probe_processed = self._probe_failures = 0

    def _maybe_open(self, now_ms: int) -> Transition | None:
        rate, calls = self.window(now_ms)
        config = self.config
        if self._consecutive_failures >= config.consecutive_failures:
            reason = f"{self._consecutive_failures} consecutive failures"
        elif calls >= config.min_calls and rate >= config.error_rate:
            window = format_duration_ms(config.window_ms)
            reason = f"error rate {rate:.0%} over {calls} {self.judging.unit} in {window}"
            reason += self.judging.failures_note
        else:
            return None
        self.opened_at_ms = now_ms
        self.cooldown_ms = config.cooldown_ms
        return self._move(State.OPEN, now_ms, reason, (rate, calls))

    def _judge_probes(self, now_ms: int) -> Transition | None:
        rate, calls = _rate(self._probe_processed, self._probe_failures)
        failures, config, unit = self._probe_failures, self.config, self.judging.unit
        if self.judging.one_failed_probe_reopens:
            failing = failures > 0
        elif calls < config.probes:
            return None
        else:
            failing = rate >= config.error_rate
        if failing:
            # min() before int(): a huge multiplier makes the product infinite, never an error.
            grown_ms = self.cooldown_ms * config.cooldown_multiplier
            self.cooldown_ms = int(min(grown_ms, config.max_cooldown_ms))
            self.opened_at_ms = now_ms
            cooldown = format_duration_ms(self.cooldown_ms)
            reason = f"{failures} of {calls} probe {unit} failed; cooldown {cooldown}"
            return self._move(State.OPEN, now_ms, reason, (rate, calls))
        if calls < config.probes:
            return None
        self.cooldown_ms = config.cooldown_ms
        self._window.clear()  # a fresh window: the outage's failures no longer count
        self._window_processed = self._window_failures = 0
        reason = f"{calls - failures} of {calls} {unit} processed while probing"
        return self._move(State.CLOSED, now_ms, reason, (rate, calls))

    def _move(
        self, to_state: State, now_ms: int, reason: str, evidence: tuple[float, int]
    ) -> Transition:
        rate, calls = evidence
        transition = Transition(
            self.state, to_state, now_ms, rate, calls, reason, self.opened_at_ms, self.cooldown_ms
        )
        self.state = to_state
        return transition


def judge_samples(
    state: State,
    *,
    opened_at_ms: int,
    cooldown_ms: int,
    samples: Sequence[Sample],
    now_ms: int,
    config: BreakerConfig,
    closed_at_ms: int = 0,
) -> Transition | None:
    """The change a group's per-tick samples call for (the breaker sensor's decision), or None.

    The breaker is rebuilt from its stored state and judges the samples that count for it: a
    CLOSED one only those since it last closed at ``closed_at_ms`` (0: never), as a worker's
    breaker starts a fresh window when it closes, so the probe's messages and the outage's tail
    are no part of the next decision (seen in ``kmq demo --ui``: a Spark batch writes its retry
    copies before its successes count, and a tick right after the close reopened it); a
    HALF_OPEN one only those since probing began.
    """
    breaker = CircuitBreaker(config, PER_BATCH)
    breaker.adopt(state, opened_at_ms, cooldown_ms)
    if state is State.OPEN:
        return breaker.advance(now_ms)
    if state is State.CLOSED:  # the sample that closed it belonged to the probe round
        counted = [s for s in samples if s.at_ms > closed_at_ms]
    else:
        counted = [s for s in samples if s.at_ms >= breaker.reopens_at_ms()]
    return breaker.observe(counted, now_ms)


def _rate(processed: int, failures: int) -> tuple[float, int]:
    """(failed share, messages); a failure counts as a message even before its success would
    (a sample can see a batch's retry copies before its processed messages)."""
    calls = max(processed, failures)
    return (failures / calls if calls else 0.0), calls
