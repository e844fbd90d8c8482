"""The tracker job of a queue: one op runs the redelivery tracker until the run is terminated,
and the keep-alive sensor that keeps exactly one such run going.

The tracker's poll loop runs on the op's main thread, where Dagster raises
``DagsterExecutionInterruptedError`` when the run is terminated: it leaves the loop within one
poll (0.1 s), commits the markers position, closes its consumer, and the run ends CANCELED.
Should that interrupt never reach the op (it is one SIGINT, sent once, through the code server
and the run's process), the op sees its run's status at its next heartbeat and stops the same way:
a terminated tracker never stays CANCELING.
While running, the op stamps a heartbeat on its run (a run tag) every few seconds; a run whose
process died (SIGKILL, a lost machine) stops stamping, and the keep-alive sensor marks it failed
and launches another. Its replacement resumes from the committed markers position: nothing is
lost.

A tracker run also stops, cleanly, when a process it was started under is gone
(:class:`~kmq_dagster.child_processes.Lifeline`): a killed ``dagster dev`` or ``dg dev`` does not
leave it running (its code server would wait for it forever). Under a run launcher that starts
the run as a container's first process there is nothing above it to lose.

No ``from __future__ import annotations`` here: Dagster reads op and sensor signatures at run
time.
"""

import os
import socket
import threading
import time

from dagster import (
    AssetObservation,
    Config,
    DagsterExecutionInterruptedError,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    op,
    sensor,
)
from pydantic import Field

from kmq_dagster.child_processes import Lifeline
from kmq_dagster.defs.processing import ensure_queue
from kmq_dagster.defs.queue_spec import QueueSpec, queue_job
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.defs.sensors import IN_FLIGHT
from kmq_dagster.errors import KmqError, ProvisionError
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.operations.queue_status import measure_queue

#: Run tag holding the time (epoch seconds) of the tracker's last sign of life.
HEARTBEAT_TAG = "kmq/heartbeat"
#: Run tags naming the process and host the tracker runs in.
PID_TAG = "kmq/pid"
HOST_TAG = "kmq/host"
#: Seconds between heartbeats.
HEARTBEAT_INTERVAL_S = 2.0
#: A started tracker run without a heartbeat for this long is taken for dead.
STALE_AFTER_S = 10.0
#: A run that has not stamped its first heartbeat yet gets this long to start its op.
START_GRACE_S = 120.0
#: Seconds between looks at the processes the tracker run was started under.
LIFELINE_INTERVAL_S = 1.0
#: Run statuses that mean "terminate was asked for".
TERMINATING = (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)


class TrackerConfig(Config):
    stats_interval_s: float = Field(
        default=60.0, description="seconds between stats lines and queue observations"
    )


def tracker_job(spec: QueueSpec) -> JobDefinition:
    """``track_<name>``: the redelivery tracker of ``spec``'s queue, until terminated."""

    @op(name=f"track_{spec.name}_redeliveries", tags=spec.tags)
    def run_tracker(context: OpExecutionContext, config: TrackerConfig, kmq: KmqResource) -> None:
        instance, run_id = context.instance, context.run_id
        earlier = earlier_tracker_run(instance, job_name=context.job_name, run_id=run_id)
        if earlier is not None:
            context.log.info(
                f"tracker run {earlier} of {spec.queue} was launched first and is alive: "
                "one tracker run per queue, so this one ends"
            )
            return
        settings = kmq.get_settings()
        queue = ensure_queue(settings, spec.queue)
        tracker = RedeliveryTracker(queue)
        last = {"heartbeat": 0.0, "stats": time.monotonic(), "lifeline": time.monotonic()}
        lifeline, stop, terminated = Lifeline(), threading.Event(), threading.Event()
        # Where the tracker runs, for an operator looking for its process.
        instance.add_run_tags(run_id, {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()})

        def on_tick() -> None:
            now = time.monotonic()
            if now - last["heartbeat"] >= HEARTBEAT_INTERVAL_S:
                instance.add_run_tags(run_id, {HEARTBEAT_TAG: f"{time.time():.3f}"})
                last["heartbeat"] = now
                if not stop.is_set() and _terminate_asked(instance, run_id):
                    context.log.warning(
                        "this run is being terminated but no interrupt reached the tracker: "
                        "it stops now"
                    )
                    terminated.set()
                    stop.set()
            if now - last["stats"] >= config.stats_interval_s:
                last["stats"] = now
                context.log.info(f"tracker of {queue}: {tracker.describe_stats()}")
                context.log_event(_observation(spec, tracker, kmq))
            if now - last["lifeline"] >= LIFELINE_INTERVAL_S and not stop.is_set():
                last["lifeline"] = now
                lost = lifeline.lost()
                if lost is not None:
                    context.log.warning(
                        f"{lost}, which this tracker run was started under, is gone (Dagster "
                        "was stopped or killed): the tracker stops; the keep-alive sensor "
                        "starts a new one when Dagster runs again"
                    )
                    stop.set()

        context.log.info(f"tracking {queue}; terminate the run to stop it")
        try:
            tracker.run(stop, on_tick=on_tick)  # until terminated, or its Dagster is gone
        finally:
            if tracker.stopped_in_s is not None:
                context.log.info(f"tracker of {queue}: {tracker.describe_stop()}")
        if terminated.is_set():
            raise DagsterExecutionInterruptedError()  # what Dagster's own interrupt raises

    return queue_job(
        spec,
        "track",
        run_tracker,
        description=f"The redelivery tracker of {spec.queue}: runs until terminated; "
        f"{spec.job_name('keep_tracker')} keeps one running.",
    )


def _terminate_asked(instance: DagsterInstance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    return run is not None and run.status in TERMINATING


def _observation(spec: QueueSpec, tracker: RedeliveryTracker, kmq: KmqResource) -> AssetObservation:
    stats = tracker.stats
    status = measure_queue(tracker.opened)
    metadata: dict[str, MetadataValue] = {
        "in_flight": MetadataValue.int(status.inflight),
        "redelivered": MetadataValue.int(stats.redelivered),
        "dead_lettered": MetadataValue.int(stats.dead_lettered),
        "tracker_in_flight": MetadataValue.int(tracker.inflight_count()),
        "tracked_partitions": MetadataValue.int(len(tracker.owned_partitions())),
    }
    if status.oldest_unacked_age_ms is not None:
        metadata["oldest_unacked_age_s"] = MetadataValue.float(status.oldest_unacked_age_ms / 1000)
    return AssetObservation(asset_key=spec.queue_asset_key, metadata=metadata)


def earlier_tracker_run(instance: DagsterInstance, *, job_name: str, run_id: str) -> str | None:
    """Another live tracker run of the job created before ``run_id``, if any (a tracker
    launched by hand while the keep-alive sensor's runs: the later one gives way)."""
    records = instance.get_run_records(filters=RunsFilter(job_name=job_name, statuses=IN_FLIGHT))
    mine = next((r for r in records if r.dagster_run.run_id == run_id), None)
    dead = {
        run.run_id
        for run in dead_tracker_runs(instance, [r.dagster_run for r in records], time.time())
    }
    for record in records:
        other = record.dagster_run.run_id
        if other == run_id or other in dead:
            continue
        if mine is None or record.create_timestamp < mine.create_timestamp:
            return other
    return None


def dead_tracker_runs(
    instance: DagsterInstance, runs: list[DagsterRun], now_s: float
) -> list[DagsterRun]:
    """The started runs among ``runs`` whose heartbeat went quiet (their process is gone)."""
    dead = []
    for run in runs:
        if run.status != DagsterRunStatus.STARTED:
            continue
        beat = run.tags.get(HEARTBEAT_TAG)
        if beat is not None:
            if now_s - float(beat) > STALE_AFTER_S:
                dead.append(run)
            continue
        record = instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record is not None else None
        if started is not None and now_s - started > START_GRACE_S:
            dead.append(run)
    return dead


def make_tracker_keepalive_sensor(
    spec: QueueSpec,
    job_def: JobDefinition,
    *,
    minimum_interval_seconds: int = 10,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """A sensor that keeps exactly one tracker run of ``spec``'s queue in progress.

    It launches one when none is queued, starting or running and the queue is provisioned (until
    then it skips, naming the provisioning job: a tracker has no markers topic to read before),
    and never two: the run key names
    the previous tracker run, so ticks that see the same runs request the same key (Dagster
    launches it once). A started run whose heartbeat went quiet for :data:`STALE_AFTER_S`
    (its process was killed) is marked failed, and a new run is requested in the same tick.

    The sensor names ``job_def`` rather than holding it, so put ``job_def`` in the same
    ``Definitions``' jobs (:func:`~kmq_dagster.defs.kmq_definitions` does). Holding it made
    Dagster copy the sensor to bind the job's resources, and that copy raised a ``BetaWarning``
    (``owners``) on every load.
    """

    @sensor(
        name=spec.job_name("keep_tracker"),
        job_name=job_def.name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Keeps one {job_def.name} run in progress.",
    )
    def keep_tracker(context: SensorEvaluationContext, kmq: KmqResource) -> SensorResult:
        instance = context.instance
        in_flight = list(
            instance.get_runs(filters=RunsFilter(job_name=job_def.name, statuses=IN_FLIGHT))
        )
        for run in dead_tracker_runs(instance, in_flight, time.time()):
            message = (
                f"tracker run {run.run_id} sent no heartbeat for over {STALE_AFTER_S:g} s: its "
                "process is gone; a new tracker run replaces it"
            )
            instance.report_run_failed(run, message)
            context.log.warning(message)
            in_flight.remove(run)
        if in_flight:
            run = in_flight[0]
            return SensorResult(
                skip_reason=f"tracker run {run.run_id} is {run.status.value.lower()}"
            )
        unready = _not_ready_reason(spec, kmq)
        if unready is not None:
            return SensorResult(skip_reason=unready)
        latest = instance.get_runs(filters=RunsFilter(job_name=job_def.name), limit=1)
        after = latest[0].run_id if latest else "none"
        return SensorResult(
            run_requests=[RunRequest(run_key=f"tracker-after-{after}", tags=spec.tags)]
        )

    return keep_tracker


def _not_ready_reason(spec: QueueSpec, kmq: KmqResource) -> str | None:
    """Why no tracker run can start yet (the queue is not provisioned, Kafka does not answer),
    in words an operator acts on; ``None``: it can."""
    try:
        kmq.open_queue(spec.queue)
    except ProvisionError as exc:
        return (
            f"{spec.queue} is not provisioned yet, so no tracker run: {exc}; or launch "
            f"{spec.job_name('provision')}. The tracker starts on the first tick after."
        )
    except KmqError as exc:
        return f"no tracker run for {spec.queue} for now: {exc}"
    return None
