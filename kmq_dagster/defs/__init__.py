"""Dagster definitions for kmq queues: declare queues once, get assets, checks, jobs, sensors.

Examples:
    >>> from kmq_dagster.defs import QueueSpec, kmq_definitions    # doctest: +SKIP
    >>> defs = kmq_definitions(queues=[QueueSpec(queue, function=f, output_path=p)])
    ...                                                              # doctest: +SKIP
"""

from __future__ import annotations

from kmq_dagster.defs.alerts import KmqAlertsResource, make_run_failure_alert_sensor
from kmq_dagster.defs.breaker import make_breaker_sensor
from kmq_dagster.defs.factory import kmq_definitions, queue_definitions
from kmq_dagster.defs.housekeeping import housekeeping_schedules, make_processing_schedule
from kmq_dagster.defs.jobs import provision_declared_job, provision_job
from kmq_dagster.defs.operator_jobs import discard_job, ingest_job, replay_job
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import (
    AuditStoreResource,
    KmqResource,
    KmqSparkResource,
    local_pyspark_resource,
    local_spark_config,
)
from kmq_dagster.defs.sensors import make_backlog_sensor, make_observation_sensor
from kmq_dagster.defs.tracker import make_tracker_keepalive_sensor, tracker_job

__all__ = [
    "AuditStoreResource",
    "KmqAlertsResource",
    "KmqResource",
    "KmqSparkResource",
    "QueueSpec",
    "discard_job",
    "housekeeping_schedules",
    "ingest_job",
    "kmq_definitions",
    "local_pyspark_resource",
    "local_spark_config",
    "make_backlog_sensor",
    "make_breaker_sensor",
    "make_observation_sensor",
    "make_processing_schedule",
    "make_run_failure_alert_sensor",
    "make_tracker_keepalive_sensor",
    "provision_declared_job",
    "provision_job",
    "queue_definitions",
    "replay_job",
    "tracker_job",
]
