"""Everything Dagster needs for a list of declared queues, from one call.

Examples:
    >>> from kmq_dagster import Queue, RetryPolicy
    >>> from kmq_dagster.defs import QueueSpec, kmq_definitions
    >>> defs = kmq_definitions(
    ...     queues=[QueueSpec(Queue("orders", "pricing", partitions=2,
    ...                             retry_policy=RetryPolicy.fixed([1_000, 3_000])),
    ...                       function=lambda message: message.value,
    ...                       output_path="/tmp/orders_priced.parquet")]
    ... )
    >>> sorted(job.name for job in defs.jobs if job.name.endswith("orders__pricing"))
    ... # doctest: +NORMALIZE_WHITESPACE
    ['discard_orders__pricing', 'ingest_orders__pricing', 'process_orders__pricing',
     'provision_orders__pricing', 'replay_orders__pricing', 'track_orders__pricing']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import DefaultScheduleStatus, DefaultSensorStatus, Definitions, define_asset_job
from dagster_pyspark import PySparkResource

from kmq_dagster.defs.alerts import KmqAlertsResource, make_run_failure_alert_sensor
from kmq_dagster.defs.assets import processing_asset, queue_asset
from kmq_dagster.defs.breaker import make_breaker_sensor
from kmq_dagster.defs.checks import queue_checks
from kmq_dagster.defs.housekeeping import housekeeping_schedules, make_processing_schedule
from kmq_dagster.defs.jobs import provision_declared_job
from kmq_dagster.defs.operator_jobs import discard_job, ingest_job, replay_job
from kmq_dagster.defs.queue_spec import QueueSpec, check_unique_names
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource, local_pyspark_resource
from kmq_dagster.defs.sensors import make_backlog_sensor, make_observation_sensor
from kmq_dagster.defs.tracker import make_tracker_keepalive_sensor, tracker_job


def queue_definitions(
    spec: QueueSpec, *, default_sensor_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING
) -> Definitions:
    """One queue's assets, checks, jobs and sensors (no resources): merge several with
    ``Definitions.merge`` or use :func:`kmq_definitions`.

    The resources they need are ``kmq`` (:class:`KmqResource`), ``audit``
    (:class:`AuditStoreResource`) and, for processing, ``pyspark`` (``PySparkResource``).
    """
    status = default_sensor_status
    assets: list[Any] = [queue_asset(spec)]
    jobs: list[Any] = [
        provision_declared_job(spec),
        replay_job(spec),
        discard_job(spec),
        ingest_job(spec),
    ]
    sensors: list[Any] = [make_observation_sensor(spec, default_status=status)]
    if spec.keep_tracker:
        track = tracker_job(spec)
        jobs.append(track)
        sensors.append(
            make_tracker_keepalive_sensor(
                spec,
                track,
                minimum_interval_seconds=spec.keepalive_interval_s,
                default_status=status,
            )
        )
    if spec.breaker is not None:
        sensors.append(
            make_breaker_sensor(
                spec,
                spec.breaker,
                minimum_interval_seconds=spec.breaker_interval_s,
                default_status=status,
            )
        )
    if spec.processes:
        assets.append(processing_asset(spec))
        process = define_asset_job(
            spec.job_name("process"),
            selection=[spec.output_asset_key],
            description=f"Process {spec.queue} on Spark until idle; launched by "
            f"{spec.job_name('backlog')}.",
            tags=spec.tags,
        )
        jobs.append(process)
        sensors.append(make_backlog_sensor(spec, process, default_status=status))
    schedules: list[Any] = []
    if spec.processes and spec.processing_cron:
        schedules.append(make_processing_schedule(spec, spec.processing_cron))
    return Definitions(
        assets=assets,
        asset_checks=[queue_checks(spec)],
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
    )


def kmq_definitions(
    queues: Sequence[QueueSpec],
    *,
    kmq: KmqResource | None = None,
    audit: AuditStoreResource | None = None,
    pyspark: PySparkResource | None = None,
    alerts: KmqAlertsResource | None = None,
    default_sensor_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    retention_schedule_status: DefaultScheduleStatus = DefaultScheduleStatus.STOPPED,
    extra_resources: Mapping[str, Any] | None = None,
) -> Definitions:
    """Definitions for ``queues``: per queue an observed queue asset with its checks, a
    provisioning job, an observation sensor, a tracker job with its keep-alive sensor, a
    breaker sensor and, for queues with a function or transform, the processing asset, its job
    and a backlog sensor (and a cron schedule if declared); plus the daily audit retention and
    dead-letter digest jobs and a sensor sending failed kmq runs to the alert sinks. Every job
    launches with no config.

    Args:
        kmq: Kafka for kmq; default from the ``KMQ_*`` environment.
        audit: the audit store; default ``KMQ_AUDIT_URL`` or ``~/.kmq/audit.db``.
        pyspark: the SparkSession's resource; default local[2] (:func:`local_pyspark_resource`).
        alerts: where alerts go besides the Dagster log (Slack, webhook, e-mail); default none.
        default_sensor_status: whether the sensors run as soon as the code location loads.
        retention_schedule_status: whether the daily audit retention runs (it deletes old
            rows, so it starts stopped); the daily dead-letter digest runs.

    Raises:
        ConfigError: two queues would get the same Dagster name.
    """
    check_unique_names(queues)
    per_queue = [queue_definitions(s, default_sensor_status=default_sensor_status) for s in queues]
    shared = location_definitions(
        kmq_resources(kmq=kmq, audit=audit, pyspark=pyspark, alerts=alerts, extra=extra_resources),
        monitored_jobs=[job for defs in per_queue for job in defs.jobs or ()],
        default_sensor_status=default_sensor_status,
        retention_schedule_status=retention_schedule_status,
    )
    return Definitions.merge(*per_queue, shared)


def kmq_resources(
    *,
    kmq: KmqResource | None = None,
    audit: AuditStoreResource | None = None,
    pyspark: PySparkResource | None = None,
    alerts: KmqAlertsResource | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The resources kmq's definitions need, each one not given at its default (see
    :func:`kmq_definitions`), plus ``extra``."""
    return {
        "kmq": kmq or KmqResource(),
        "audit": audit or AuditStoreResource(),
        "pyspark": pyspark or local_pyspark_resource(),
        "alerts": alerts or KmqAlertsResource(),
        **(extra or {}),
    }


def location_definitions(
    resources: Mapping[str, Any],
    *,
    monitored_jobs: Sequence[Any] | None,
    default_sensor_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    retention_schedule_status: DefaultScheduleStatus = DefaultScheduleStatus.STOPPED,
) -> Definitions:
    """What a code location holds once, whatever its number of queues: ``resources``, the
    daily audit retention and dead-letter digest jobs with their schedules, and the
    ``kmq_run_failures`` sensor over ``monitored_jobs`` and the daily jobs (``None``: over
    every run of the code location that carries a ``kmq/`` tag, as every kmq job's runs do)."""
    daily_jobs, daily = housekeeping_schedules(retention_status=retention_schedule_status)
    failures = make_run_failure_alert_sensor(
        None if monitored_jobs is None else [*monitored_jobs, *daily_jobs],
        default_status=default_sensor_status,
    )
    return Definitions(
        jobs=daily_jobs, schedules=daily, sensors=[failures], resources=dict(resources)
    )
