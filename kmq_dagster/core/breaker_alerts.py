"""Which stored breaker transitions become alerts, and when the breaker last closed.

:func:`next_alert` decides alerts: one per transition (kept by transition id), a resolve message
as soon as the breaker closes after an announced problem, and otherwise at most one alert per
breaker per ``period_ms`` while it flaps (the transitions in between are folded into the next).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kmq_dagster.core.breaker import State


@dataclass(frozen=True)
class TransitionEvent:
    """A stored breaker transition (``breaker_transitions`` row)."""

    id: int
    from_state: State
    to_state: State
    at_ms: int
    reason: str


def last_closed_ms(transitions: Sequence[TransitionEvent]) -> int:
    """When the breaker last closed, per its stored transitions (0: never)."""
    return max((t.at_ms for t in transitions if t.to_state is State.CLOSED), default=0)


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
    resolve = latest.to_state is State.CLOSED
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
