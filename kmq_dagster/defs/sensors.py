"""Sensors of a queue: the backlog sensor launches processing runs, the observation sensor
records what the queue is doing.

No ``from __future__ import annotations`` here: Dagster reads the sensor functions' resource
parameters at run time.
"""

import json

from dagster import (
    AssetCheckEvaluation,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from kmq_dagster.core.queue_checks import CheckOutcome, format_epoch_ms
from kmq_dagster.core.readable import duration_text, rate_text
from kmq_dagster.core.status import TOTALS, QueueStatus, Rates, rates_between
from kmq_dagster.defs.checks import queue_check_outcomes
from kmq_dagster.defs.observations import check_evaluation, status_metadata
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.errors import KmqError, ProvisionError
from kmq_dagster.operations.dlq_ingester import ingest_dead_letters
from kmq_dagster.operations.queue_status import measure_queue

#: Run statuses that count as "in flight".
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
RUN_KEY_TAG = "dagster/run_key"


def runs_in_flight(instance: DagsterInstance, job_name: str) -> list[str]:
    """Ids of ``job_name``'s runs that are queued, starting or running."""
    runs = instance.get_runs(filters=RunsFilter(job_name=job_name, statuses=IN_FLIGHT), limit=5)
    return [run.run_id for run in runs]


def _failed_run_with_key(instance: DagsterInstance, run_key: str) -> str | None:
    runs = instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    if runs and runs[0].status == DagsterRunStatus.FAILURE:
        return runs[0].run_id
    return None


def backlog_decision(
    spec: QueueSpec, status: QueueStatus, instance: DagsterInstance, job_name: str
) -> RunRequest | SkipReason:
    """A processing run for ``status``'s backlog, or the reason a person reads for none."""
    queue = spec.queue
    if status.breaker_state == "open":
        since = format_epoch_ms(status.breaker_opened_at_ms or status.measured_at_ms)
        return SkipReason(
            f"throttled: the circuit breaker of {queue} is open since {since}; processing "
            f"resumes when it closes ({status.describe_backlog()})"
        )
    if status.work == 0:
        return SkipReason(f"no backlog for {queue}: {status.describe_backlog()}")
    run_key = status.run_key()
    failed = _failed_run_with_key(instance, run_key)
    if failed is not None:
        return SkipReason(
            f"the processing run {failed} for this backlog of {queue} failed and the offsets "
            "have not moved since; look at its logs and re-execute it, or wait for new messages"
        )
    return RunRequest(
        run_key=run_key,
        job_name=job_name,
        tags={**spec.tags, "kmq/work": str(status.work)},
    )


def make_backlog_sensor(
    spec: QueueSpec,
    job: JobDefinition | UnresolvedAssetJobDefinition,
    *,
    minimum_interval_seconds: int | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """A sensor that requests a run of ``job`` (processing ``spec``'s queue) when the queue has
    work: lag, redelivered copies, or retries that are due. At most one run per queue is in
    flight; the run key is derived from the offsets, so ticks over unchanged offsets request one
    run. While the group's circuit breaker is open it skips, saying since when.

    Args:
        minimum_interval_seconds: seconds between ticks; default ``spec.backlog_interval_s``.

    Examples:
        >>> sensor = make_backlog_sensor(spec, define_asset_job("process", [spec.output_asset_key]))
        ...                                                                 # doctest: +SKIP
    """

    @sensor(
        name=spec.job_name("backlog"),
        job=job,
        minimum_interval_seconds=minimum_interval_seconds or spec.backlog_interval_s,
        default_status=default_status,
        description=f"Launches {job.name} when {spec.queue} has a backlog.",
    )
    def backlog_sensor(
        context: SensorEvaluationContext, kmq: KmqResource, audit: AuditStoreResource
    ) -> SensorResult:
        try:
            status = measure_queue(kmq.open_queue(spec.queue), store=audit.get_store())
        except ProvisionError as exc:
            return SensorResult(skip_reason=f"{exc}; launch {spec.job_name('provision')}")
        in_flight = runs_in_flight(context.instance, job.name)
        if in_flight and status.breaker_state != "open":  # an open breaker is said first
            return SensorResult(skip_reason=f"processing run {in_flight[0]} is in flight")
        decision = backlog_decision(spec, status, context.instance, job.name)
        if isinstance(decision, SkipReason):
            return SensorResult(skip_reason=decision)
        context.log.info(
            f"backlog of {spec.queue}: {status.work:,} messages ({status.describe_backlog()}); "
            f"launching {job.name}"
        )
        return SensorResult(run_requests=[decision])

    return backlog_sensor


def describe_observation(
    status: QueueStatus, rates: Rates | None, new_dead_letters: int, outcomes: list[CheckOutcome]
) -> str:
    """An observation tick in one line: the backlog, how old the oldest unacknowledged message
    is, the rates, new dead letters, the breaker, and which checks fail."""
    oldest = duration_text(status.oldest_unacked_age_ms)
    parts = [f"observed {status.describe_backlog()} (oldest {oldest})"]
    if rates is not None:
        parts.append(f"in {rate_text(rates.in_per_s)}, acked {rate_text(rates.ack_per_s)}")
    parts.append(f"{new_dead_letters:,} new dead letters stored, {status.dlq_depth:,} in the DLQ")
    parts.append(f"breaker {status.breaker_state.replace('_', '-')}")
    failing = [f"{o.name} ({o.description})" for o in outcomes if not o.passed]
    parts.append(f"failing: {'; '.join(failing)}" if failing else "every check passes")
    return "; ".join(parts)


def make_observation_sensor(
    spec: QueueSpec,
    *,
    minimum_interval_seconds: int | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """A sensor that, per tick, copies up to ``spec.ingest_per_tick`` new dead letters into the
    audit store, measures the queue, writes a ``queue_snapshots`` row, and emits an observation
    of the queue asset with the queue's check evaluations."""

    @sensor(
        name=spec.job_name("observe"),
        minimum_interval_seconds=minimum_interval_seconds or spec.observation_interval_s,
        default_status=default_status,
        description=f"Observes {spec.queue}: lag, in flight, retries, dead letters, breaker.",
    )
    def observation_sensor(
        context: SensorEvaluationContext, kmq: KmqResource, audit: AuditStoreResource
    ) -> SensorResult:
        store = audit.get_store()
        try:
            opened = kmq.open_queue(spec.queue)
            ingested = ingest_dead_letters(opened, store, max_records=spec.ingest_per_tick)
            status = measure_queue(opened, store=store)
        except ProvisionError as exc:
            return SensorResult(skip_reason=f"{exc}; launch {spec.job_name('provision')}")
        except KmqError as exc:
            return SensorResult(skip_reason=f"cannot measure {spec.queue}: {exc}")
        previous = json.loads(context.cursor) if context.cursor else None
        rates = rates_between(previous, status) if previous else None
        store.record_snapshot(
            queue_topic=spec.queue.topic,
            group_id=spec.queue.group,
            lag=status.lag + status.redelivery_lag,
            inflight=status.inflight,
            oldest_unacked_age_ms=status.oldest_unacked_age_ms,
            in_rate=rates.in_per_s if rates else 0.0,
            ack_rate=rates.ack_per_s if rates else 0.0,
        )
        key = spec.queue_asset_key
        events: list[AssetObservation | AssetCheckEvaluation] = [
            AssetObservation(
                asset_key=key, metadata=status_metadata(status, rates, ingested.stored)
            )
        ]
        outcomes = queue_check_outcomes(spec, status, store)
        events += [check_evaluation(o, key) for o in outcomes]
        totals = status.totals()
        return SensorResult(
            asset_events=events,
            cursor=json.dumps({name: totals[name] for name in TOTALS}),
            # No runs to request: the tick's message is what it saw (else Dagster shows
            # "Sensor function returned an empty result").
            skip_reason=describe_observation(status, rates, ingested.stored, outcomes),
        )

    return observation_sensor
