"""Dagster definitions for kmq queues: declare queues once, get assets, checks, jobs, sensors.

Examples:
    >>> from kmq_dagster.defs import QueueSpec, kmq_definitions    # doctest: +SKIP
    >>> defs = kmq_definitions(queues=[QueueSpec(queue, function=f, output_path=p)])
    ...                                                              # doctest: +SKIP
"""

from __future__ import annotations

from kmq_dagster.defs.factory import kmq_definitions, queue_definitions
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import (
    AuditStoreResource,
    KmqResource,
    local_pyspark_resource,
    local_spark_config,
)
from kmq_dagster.defs.sensors import make_backlog_sensor, make_observation_sensor

__all__ = [
    "AuditStoreResource",
    "KmqResource",
    "QueueSpec",
    "kmq_definitions",
    "local_pyspark_resource",
    "local_spark_config",
    "make_backlog_sensor",
    "make_observation_sensor",
    "queue_definitions",
]
