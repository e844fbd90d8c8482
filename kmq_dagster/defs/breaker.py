"""The circuit-breaker sensor: throttles a group on error floods and announces transitions.

Each tick it measures the queue, adds what the group did since the last tick (messages
processed, copies written to the retry topics; an operator's replay writes none, see
:mod:`kmq_dagster.core.breaker_samples`) to a window kept in its cursor, and runs the
breaker's state machine on it (:func:`kmq_dagster.core.breaker.judge_samples`). A change is
written to the group's shared breaker in the audit store through the same writer as
``kmq worker --breaker`` processes use (:class:`~kmq_dagster.audit.breaker_state.StoredBreaker`:
compare-and-set, then the transition and its alert), so workers stop pulling work within a second,
Spark processing runs stop before their next batch and the backlog sensor skips. Every stored
transition, the workers' included, becomes a ``breaker_closed`` check evaluation and an
observation of the queue asset (the reason in words, the time as a timestamp), and an alert;
each tick's message says what the sensor saw ("breaker closed, error rate 2% over 40 messages
in the last 30s; nothing to do") or did ("breaker opened: ...; alert sent: ...").

No ``from __future__ import annotations`` here: Dagster reads the sensor's resource parameters
at run time.
"""

from collections.abc import Sequence

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kmq_dagster.audit.breaker_state import (
    SEVERITIES,
    StoredBreaker,
    transition_event,
)
from kmq_dagster.audit.models import BreakerTransition
from kmq_dagster.core.breaker import BreakerConfig, State, judge_samples
from kmq_dagster.core.breaker_alerts import (
    AlertDecision,
    TransitionEvent,
    last_closed_ms,
    next_alert,
)
from kmq_dagster.core.breaker_reports import describe_transition
from kmq_dagster.core.breaker_tick import SensorMemory, quiet_tick, tick_lines
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_checks import BREAKER_CLOSED
from kmq_dagster.core.readable import percent_text, state_text
from kmq_dagster.defs.alert_sinks import Alert
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.errors import KmqError
from kmq_dagster.operations.queue_status import measure_queue


def _alert(queue: Queue, decision: AlertDecision) -> Alert:
    transition = decision.transition
    if decision.resolve:
        title = "resolved: circuit breaker closed"
    else:
        title = f"circuit breaker {state_text(transition.to_state)}"
    folded = f" ({decision.folded} transitions since the last alert)" if decision.folded > 1 else ""
    return Alert(
        kind=f"breaker_{transition.to_state}",
        severity=SEVERITIES[transition.to_state],
        subject=str(queue),
        title=title,
        text=(
            f"{state_text(transition.from_state)} -> {state_text(transition.to_state)}: "
            f"{transition.reason}{folded}"
        ),
        key=f"{queue.topic}/{queue.group}#transition-{transition.id}",
        details={"transition_id": transition.id, "at_ms": transition.at_ms},
    )


def _transition_metadata(
    row: BreakerTransition, event: TransitionEvent, description: str
) -> dict[str, MetadataValue]:
    """What a transition's check evaluation and observation carry: the human reason, when
    (a timestamp, shown as a time), and the evidence."""
    return {
        "breaker_state": MetadataValue.text(event.to_state.value),
        "transition": MetadataValue.text(
            f"{state_text(event.from_state.value)} -> {state_text(event.to_state.value)}"
        ),
        "reason": MetadataValue.text(description),
        "changed_at": MetadataValue.timestamp(event.at_ms / 1000),
        "error_rate": MetadataValue.text(percent_text(row.error_rate)),
        "messages_judged": MetadataValue.int(row.window_calls),
        "transition_id": MetadataValue.text(str(event.id)),  # an id: not to be plotted
    }


def _transition_events(
    spec: QueueSpec, row: BreakerTransition, transitions: Sequence[TransitionEvent]
) -> tuple[str, list[AssetCheckEvaluation | AssetObservation]]:
    """A stored transition as a person reads it, and as the events that put it where a Dagster
    user looks: a ``breaker_closed`` check evaluation and an observation of the queue asset."""
    (event,) = [t for t in transitions if t.id == row.id]
    description = describe_transition(event, transitions)
    metadata = _transition_metadata(row, event, description)
    evaluation = AssetCheckEvaluation(
        asset_key=spec.queue_asset_key,
        check_name=BREAKER_CLOSED,
        passed=event.to_state is State.CLOSED,
        severity=AssetCheckSeverity.ERROR,
        description=f"circuit breaker {description}",
        metadata=metadata,
    )
    observation = AssetObservation(
        asset_key=spec.queue_asset_key,
        description=f"circuit breaker {description}",
        metadata=metadata,
    )
    return f"breaker {description}", [evaluation, observation]


def make_breaker_sensor(
    spec: QueueSpec,
    config: BreakerConfig | None = None,
    *,
    minimum_interval_seconds: int = 10,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """A sensor that opens ``spec``'s group breaker on an error flood, probes and closes it
    as the workers do, and turns every transition into a check evaluation and an alert.

    Args:
        config: when to open (window, min calls, error rate), cooldown and probes; the
            defaults of :class:`BreakerConfig` when not given.
    """
    breaker_config = config or BreakerConfig()
    queue = spec.queue
    window_ms = breaker_config.window_ms

    @sensor(
        name=spec.job_name("breaker"),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Throttles {queue} on error floods and alerts on breaker transitions.",
    )
    def breaker_sensor(
        context: SensorEvaluationContext,
        kmq: KmqResource,
        audit: AuditStoreResource,
        alerts: KmqAlertsResource,
    ) -> SensorResult:
        store = audit.get_store()
        try:
            status = measure_queue(kmq.open_queue(queue), store=store)
        except KmqError as exc:
            return SensorResult(skip_reason=f"cannot measure {queue}: {exc}")
        memory = SensorMemory.from_cursor(context.cursor)
        now_ms = status.measured_at_ms
        samples = memory.add_measurement(status.totals(), at_ms=now_ms, window_ms=window_ms)
        stored = StoredBreaker(store, queue, window_ms=window_ms, source="breaker sensor")
        row = stored.read()
        state = row.state if row is not None else State.CLOSED
        rows = store.transitions(queue.topic, queue.group)
        transitions = [transition_event(r) for r in rows]
        moved = judge_samples(
            state,
            opened_at_ms=row.opened_at_ms if row is not None else 0,
            cooldown_ms=row.cooldown_ms if row is not None else breaker_config.cooldown_ms,
            samples=samples,
            now_ms=now_ms,
            config=breaker_config,
            closed_at_ms=last_closed_ms(transitions),
        )
        expected_version = row.version if row is not None else None
        if moved is not None and stored.write(moved, expected_version=expected_version):
            context.log.warning(f"breaker of {queue}: {state} -> {moved.to_state}: {moved.reason}")
            rows = store.transitions(queue.topic, queue.group)
            transitions = [transition_event(r) for r in rows]
            row = stored.read()
            state = row.state if row is not None else state
        fresh = [r for r in rows if r.id > memory.last_transition_id]
        reported = [_transition_events(spec, r, transitions) for r in fresh]
        events = [event for _, row_events in reported for event in row_events]
        quiet = quiet_tick(
            state, samples, breaker_config, now_ms,
            opened_at_ms=row.opened_at_ms if row is not None else None,
            cooldown_ms=row.cooldown_ms if row is not None else None,
        )  # fmt: skip
        said = tick_lines([line for line, _ in reported], quiet)
        decision, memory.alerts = next_alert(
            memory.alerts, transitions, now_ms, int(alerts.min_period_s * 1000)
        )
        if decision is not None:
            alert = _alert(queue, decision)
            undelivered = alerts.send(alert, context.log)
            said.append(f"alert {'NOT delivered' if undelivered else 'sent'}: {alert.title}")
        memory.last_transition_id = max([memory.last_transition_id, *(r.id for r in fresh)])
        # The sensor never requests runs: its tick message is what it saw and did.
        return SensorResult(
            asset_events=events, cursor=memory.to_cursor(), skip_reason="; ".join(said)
        )

    return breaker_sensor
