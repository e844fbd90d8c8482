"""The one writer of a group's shared breaker in the audit store.

The ``breaker_states`` row of a topic and group is changed only with compare-and-set on its
version, and a change that wins is recorded as a ``breaker_transitions`` row and an ``alerts``
row (opening is critical, probing a warning, closing info). Worker processes
(:class:`~kmq_dagster.audit.shared_breaker.SharedBreaker`) and the Dagster breaker sensor both
go through :class:`StoredBreaker`, so a transition is stored and alerted alike whoever decided it.
The store keeps states as strings; they are :class:`~kmq_dagster.core.breaker.State` from here on.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq_dagster.audit.models import BreakerTransition
from kmq_dagster.audit.store import AuditStore, now
from kmq_dagster.core.breaker import State, Transition
from kmq_dagster.core.breaker_alerts import TransitionEvent
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.readable import state_text

#: The alert severity of a transition into each state.
SEVERITIES = {State.OPEN: "critical", State.HALF_OPEN: "warning", State.CLOSED: "info"}


def transition_event(row: BreakerTransition) -> TransitionEvent:
    """A stored ``breaker_transitions`` row as the core's alerting and wording read it."""
    at_ms = int(row.at.timestamp() * 1000)
    return TransitionEvent(row.id, State(row.from_state), State(row.to_state), at_ms, row.reason)


@dataclass(frozen=True)
class SharedState:
    """A group's breaker as the store holds it."""

    state: State
    opened_at_ms: int
    cooldown_ms: int
    #: Bumped on every write; a write names the version it read.
    version: int


class StoredBreaker:
    """The shared breaker row of ``queue`` (its topic and group) in ``store``.

    Args:
        window_ms: the deciding breaker's window, recorded with each transition.
        source: who decides, added to the recorded transitions' reasons (e.g. "breaker sensor").
    """

    def __init__(
        self, store: AuditStore, queue: Queue, *, window_ms: int, source: str = ""
    ) -> None:
        self.store = store
        self.queue = queue
        self.window_ms = window_ms
        self.source = source

    def read(self) -> SharedState | None:
        """The stored state, or ``None`` if no breaker of the group ever changed."""
        row = self.store.breaker_state(self.queue.topic, self.queue.group)
        if row is None:
            return None
        return SharedState(State(row.state), row.opened_at_ms, row.cooldown_ms, row.version)

    def save(
        self, state: State, opened_at_ms: int, cooldown_ms: int, *, expected_version: int | None
    ) -> bool:
        """Store the state if nobody wrote it since ``expected_version`` was read (``None``: it
        did not exist). Returns whether this write won (the version is then one higher)."""
        return self.store.save_breaker_state(
            self.queue.topic,
            self.queue.group,
            state=state.value,
            opened_at_ms=opened_at_ms,
            cooldown_ms=cooldown_ms,
            expected_version=expected_version,
        )

    def record(self, transition: Transition) -> None:
        """Record a transition that was saved: its ``breaker_transitions`` and ``alerts`` rows."""
        topic, group = self.queue.topic, self.queue.group
        states = transition.from_state.value, transition.to_state.value
        change = " -> ".join(state_text(s) for s in states)
        self.store.record_transition(
            queue_topic=topic,
            group_id=group,
            at=now(),
            from_state=transition.from_state.value,
            to_state=transition.to_state.value,
            error_rate=transition.error_rate,
            window_calls=transition.window_calls,
            window_ms=self.window_ms,
            reason=f"{transition.reason} ({self.source})" if self.source else transition.reason,
        )
        self.store.record_alert(
            queue_topic=topic,
            group_id=group,
            severity=SEVERITIES[transition.to_state],
            message=f"circuit breaker {change}: {transition.reason}",
        )

    def write(self, transition: Transition, *, expected_version: int | None) -> bool:
        """Save ``transition``'s state with compare-and-set and, if that won, record it.
        Returns whether this write won."""
        won = self.save(
            transition.to_state,
            transition.opened_at_ms,
            transition.cooldown_ms,
            expected_version=expected_version,
        )
        if won:
            self.record(transition)
        return won
