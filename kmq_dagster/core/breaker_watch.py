"""Deciding a group's shared breaker from the outside (the Dagster breaker sensor), and which
breaker transitions become alerts.

A watcher sees no single handler call; it sees, per tick, how many messages the group finished
(``processed``) and how many of them failed in a way that is retried (``failures``: copies to
the retry topics; dead letters are mostly bad input, which the workers' breaker ignores too, or
retries already counted). :func:`breaker_move` runs the breaker's state machine on those
samples with the workers' :class:`BreakerConfig`: CLOSED opens on the error rate over the
window; OPEN probes after the cooldown; HALF_OPEN judges the first ``probes`` or more messages
processed since: below the error rate it closes, else it reopens with a longer cooldown. (Unlike
a worker, which reopens on a single failed probe, a watcher sees messages in batches, where one
ordinary failure among many successes is no outage.)

:func:`next_alert` decides alerts: one per transition (kept by transition id), a resolve message
as soon as the breaker closes after an announced problem, and otherwise at most one alert per
breaker per ``period_ms`` while it flaps (the transitions in between are folded into the next).

Examples:
    >>> config = BreakerConfig(window_ms=30_000, min_calls=20, error_rate=0.5)
    >>> move = breaker_move("closed", opened_at_ms=0, cooldown_ms=10_000,
    ...                     samples=[Sample(1_000, 40, 30)], now_ms=2_000, config=config)
    >>> move.to_state, move.reason
    ('open', 'error rate 75% over 40 messages in 30s (copies to the retry topics)')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.core.durations import format_duration_ms

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class Sample:
    """What the group did between two ticks, ending at ``at_ms``."""

    at_ms: int
    processed: int
    failures: int


@dataclass(frozen=True)
class Move:
    """A state change the watcher makes."""

    to_state: str
    opened_at_ms: int
    cooldown_ms: int
    reason: str
    error_rate: float
    calls: int


@dataclass(frozen=True)
class Unsettled:
    """What earlier ticks saw that does not count yet (kept between ticks)."""

    #: Zero or less: messages that went in flight without the group's offsets moving past
    #: them yet (a Spark batch under way), to be set against their commit.
    finished: int = 0
    #: Retry copies whose messages do not count as finished yet.
    failures: int = 0


def settle(
    at_ms: int, finished: int, failures: int, unsettled: Unsettled
) -> tuple[Sample, Unsettled]:
    """The sample of one tick (from :func:`~kmq_dagster.core.status.progress_between`), and
    what stays unsettled. A failure counts once its message counts as finished: a Spark batch
    writes its retry copies while its successes are in flight, and only its offset commit at
    the end finishes them, so a tick in mid-batch would see failures alone (the batch is not
    stopped any sooner by opening then: runs check the breaker between batches). A worker
    commits, then finishes each message, so its failures count at once."""
    finished += unsettled.finished
    failures += unsettled.failures
    counted = max(0, finished)
    counted_failures = min(failures, counted)
    return Sample(at_ms, counted, counted_failures), Unsettled(
        min(0, finished), failures - counted_failures
    )


def last_closed_ms(transitions: Sequence[TransitionEvent]) -> int:
    """When the breaker last closed, per its stored transitions (0: never)."""
    return max((t.at_ms for t in transitions if t.to_state == CLOSED), default=0)


def window_totals(samples: Sequence[Sample], since_ms: int) -> tuple[int, int]:
    """(processed, failures) of the samples that end after ``since_ms``."""
    recent = [s for s in samples if s.at_ms > since_ms]
    return sum(s.processed for s in recent), sum(s.failures for s in recent)


def breaker_move(
    state: str,
    *,
    opened_at_ms: int,
    cooldown_ms: int,
    samples: Sequence[Sample],
    now_ms: int,
    config: BreakerConfig,
    closed_at_ms: int = 0,
) -> Move | None:
    """The change the samples call for, or ``None``.

    ``closed_at_ms`` is when the breaker last closed (0: never). A closed breaker judges only
    what happened since, as a worker's breaker starts a fresh window when it closes: the
    probe's messages and the outage's tail are no part of the next decision. (Seen in
    ``kmq demo --ui``: a Spark batch writes its retry copies before its successes count as
    processed, so a tick in mid-batch right after the close saw 14 failures against the
    probe's 24 messages and reopened the breaker.)
    """
    if state == CLOSED:
        since_ms = max(now_ms - config.window_ms, closed_at_ms)
        calls, failures = window_totals(samples, since_ms)
        calls = max(calls, failures)
        rate = failures / calls if calls else 0.0
        if calls >= config.min_calls and rate >= config.error_rate:
            window = format_duration_ms(config.window_ms)
            return Move(
                OPEN,
                now_ms,
                config.cooldown_ms,
                f"error rate {rate:.0%} over {calls} messages in {window} "
                "(copies to the retry topics)",
                rate,
                calls,
            )
        return None
    if state == OPEN:
        if now_ms >= opened_at_ms + cooldown_ms:
            return Move(HALF_OPEN, opened_at_ms, cooldown_ms, "cooldown over: probing", 0.0, 0)
        return None
    # HALF_OPEN: judge only what happened since probing began, once enough was processed.
    calls, failures = window_totals(samples, opened_at_ms + cooldown_ms)
    calls = max(calls, failures)
    if calls < config.probes:
        return None
    rate = failures / calls
    if rate >= config.error_rate:
        longer = int(min(cooldown_ms * config.cooldown_multiplier, config.max_cooldown_ms))
        return Move(
            OPEN,
            now_ms,
            longer,
            f"{failures} of {calls} probe messages failed; cooldown {format_duration_ms(longer)}",
            rate,
            calls,
        )
    return Move(
        CLOSED,
        0,
        config.cooldown_ms,
        f"{calls - failures} of {calls} messages processed while probing",
        rate,
        calls,
    )


@dataclass(frozen=True)
class TransitionEvent:
    """A stored breaker transition (``breaker_transitions`` row)."""

    id: int
    from_state: str
    to_state: str
    at_ms: int
    reason: str


@dataclass(frozen=True)
class AlertState:
    """What was announced for one breaker so far (kept between ticks)."""

    last_transition_id: int = 0
    last_alert_ms: int | None = None
    #: Whether the last announcement was a problem (open or probing) not yet resolved.
    problem_announced: bool = False


@dataclass(frozen=True)
class AlertDecision:
    """Announce ``transition`` (the newest of ``folded`` transitions since the last alert)."""

    transition: TransitionEvent
    folded: int
    resolve: bool


def next_alert(
    state: AlertState,
    transitions: Sequence[TransitionEvent],
    now_ms: int,
    period_ms: int,
) -> tuple[AlertDecision | None, AlertState]:
    """Which alert to send for the transitions not announced yet (ids above the state's)."""
    pending = sorted((t for t in transitions if t.id > state.last_transition_id), key=_id)
    if not pending:
        return None, state
    latest = pending[-1]
    resolve = latest.to_state == CLOSED
    if resolve and not state.problem_announced:
        # Closed again before anyone was told it opened (held by the period): nothing to say.
        return None, AlertState(latest.id, state.last_alert_ms, False)
    quiet = state.last_alert_ms is None or now_ms - state.last_alert_ms >= period_ms
    if not (quiet or (resolve and state.problem_announced)):
        return None, state  # flapping: fold these into the next alert
    decision = AlertDecision(latest, len(pending), resolve)
    return decision, AlertState(latest.id, now_ms, not resolve)


def _id(transition: TransitionEvent) -> int:
    return transition.id
