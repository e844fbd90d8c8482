"""What a group's circuit breaker did, in the words a person on call reads.

One wording for the Dagster breaker sensor's check evaluations, observations and tick messages
and for ``kmq demo --ui``'s lines: a transition reads as what happened ("opened: error rate
100% over 20 messages in 30s", "closed after 42s: 3 of 3 messages processed while probing"),
a quiet tick as what the sensor saw ("breaker closed, error rate 2% over 40 messages in the
last 30s; nothing to do").

Examples:
    >>> opened = TransitionEvent(1, State.CLOSED, State.OPEN, 10_000, "error rate 90% ...")
    >>> closed = TransitionEvent(3, State.HALF_OPEN, State.CLOSED, 52_000, "3 of 3 processed")
    >>> describe_transition(opened), describe_transition(closed, [opened, closed])
    ('opened: error rate 90% ...', 'closed after 42s: 3 of 3 processed')
"""

from __future__ import annotations

from collections.abc import Sequence

from kmq_dagster.core.breaker_alerts import TransitionEvent
from kmq_dagster.core.breaker_config import State
from kmq_dagster.core.queue_checks import format_epoch_ms
from kmq_dagster.core.readable import duration_text, percent_text


def transition_verb(from_state: State, to_state: State) -> str:
    """What the breaker did: ``opened``, ``reopened`` (a probe round failed), ``probing`` or
    ``closed``."""
    if to_state is State.OPEN:
        return "reopened" if from_state is State.HALF_OPEN else "opened"
    if to_state is State.HALF_OPEN:
        return "probing"
    return "closed"


def outage_ms(transitions: Sequence[TransitionEvent], closing: TransitionEvent) -> int | None:
    """How long the breaker was not closed before ``closing``: from the opening that began the
    episode (its last move out of CLOSED) to ``closing``. ``None`` if that opening is not among
    ``transitions`` (oldest first) or ``closing`` does not close."""
    if closing.to_state is not State.CLOSED:
        return None
    began: TransitionEvent | None = None
    for event in transitions:
        if event.id >= closing.id:
            break
        if event.from_state is State.CLOSED:
            began = event
        elif event.to_state is State.CLOSED:
            began = None
    return None if began is None else max(0, closing.at_ms - began.at_ms)


def describe_transition(event: TransitionEvent, transitions: Sequence[TransitionEvent] = ()) -> str:
    """``event`` as one line: the verb, for a closing how long it was not closed (when the
    opening is among ``transitions``), and the reason."""
    verb = transition_verb(event.from_state, event.to_state)
    lasted = outage_ms(transitions, event)
    if lasted is not None:
        verb += f" after {duration_text(lasted)}"
    return f"{verb}: {event.reason}"


def describe_quiet_tick(
    state: State,
    *,
    failures: int,
    messages: int,
    window_ms: int,
    opened_at_ms: int | None = None,
    cooldown_ms: int | None = None,
    now_ms: int,
) -> str:
    """What the breaker sensor saw on a tick that changed nothing: the state, the error rate
    over the window it judges, and what comes next."""
    window = duration_text(window_ms)
    rate = percent_text(failures / messages) if messages else "0%"
    seen = f"error rate {rate} over {messages:,} messages in the last {window}"
    if state is State.CLOSED:
        return f"breaker closed, {seen}; nothing to do"
    if state is State.HALF_OPEN:
        return f"breaker half-open: judging the probes, {seen}"
    since = f" since {format_epoch_ms(opened_at_ms)}" if opened_at_ms else ""
    if opened_at_ms is None or cooldown_ms is None:
        return f"breaker open{since}; waiting for its cooldown"
    probe_in = duration_text(max(0, opened_at_ms + cooldown_ms - now_ms))
    return f"breaker open{since}; probing in {probe_in}"
