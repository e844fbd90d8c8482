"""``KmqQueueComponent``: kmq queues declared in a ``dg`` project's ``defs.yaml``.

It builds exactly what :func:`~kmq_dagster.defs.kmq_definitions` builds from Python (it calls
it): per queue the observed queue asset with its checks, the processing asset, the provision,
tracker, processing and operator jobs, the backlog, observation, breaker and keep-alive sensors
and the optional processing schedule; plus the shared housekeeping jobs and the run-failure
alert sensor. Declare all of a code location's queues in one component: the shared jobs and
resources exist once per code location.

Examples:
    A ``defs.yaml`` (``dg scaffold defs kmq_dagster.KmqQueueComponent orders`` writes one)::

        type: kmq_dagster.KmqQueueComponent
        attributes:
          queues:
            - topic: orders
              group: invoicing
              partitions: 2
              retry: {delays: [10s, 1m]}
              function: my_project.invoicing.invoice_order
              output_path: /data/orders_invoiced.parquet
          resources:
            kafka:
              bootstrap_servers: "{{ env.KAFKA_BOOTSTRAP_SERVERS }}"
              client_config: {sasl.password: "{{ env.KAFKA_PASSWORD }}"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import BaseModel, Field

from kmq_dagster.components.queue_model import QueueModel
from kmq_dagster.components.resources_model import ResourcesModel
from kmq_dagster.defs.factory import kmq_definitions
from kmq_dagster.defs.queue_spec import check_unique_names

_STATUS = {"running": dg.DefaultSensorStatus.RUNNING, "stopped": dg.DefaultSensorStatus.STOPPED}
_SCHEDULE = {
    "running": dg.DefaultScheduleStatus.RUNNING,
    "stopped": dg.DefaultScheduleStatus.STOPPED,
}


class KmqQueueScaffoldParams(BaseModel):
    """``dg scaffold defs kmq_dagster.KmqQueueComponent NAME [--topic T] [--group G]``."""

    topic: str | None = Field(default=None, description="the queue topic (default: NAME)")
    group: str = Field(default="workers", description="the consumer group")
    partitions: int = Field(default=2, description="partitions of the queue topics")


class KmqQueueScaffolder(dg.Scaffolder[KmqQueueScaffoldParams]):
    """Writes a ``defs.yaml`` with one queue and its resources read from the environment."""

    @classmethod
    def get_scaffold_params(cls) -> type[KmqQueueScaffoldParams]:
        return KmqQueueScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[KmqQueueScaffoldParams]) -> None:
        from dagster.components.component_scaffolding import scaffold_component

        params = request.params
        scaffold_component(request, starter_attributes(request.target_path, params))


def starter_attributes(target: Path, params: KmqQueueScaffoldParams) -> dict[str, Any]:
    """What a freshly scaffolded ``defs.yaml`` declares: a queue named after its folder, no
    processing yet (add ``function`` and ``output_path``), resources from the environment."""
    return {
        "queues": [
            {
                "topic": params.topic or target.name,
                "group": params.group,
                "partitions": params.partitions,
            }
        ],
        "resources": {
            "kafka": {"bootstrap_servers": "{{ env.KMQ_BOOTSTRAP_SERVERS }}"},
            "audit": {"url": "{{ env.KMQ_AUDIT_URL }}"},
        },
    }


@dg.scaffold_with(KmqQueueScaffolder)
class KmqQueueComponent(dg.Component, dg.Resolvable, dg.Model):
    """Reliable Kafka work queues (kmq) processed on Spark, with sensors, checks and jobs."""

    queues: list[QueueModel] = Field(description="the queues of this code location")
    resources: ResourcesModel | None = Field(
        default=None, description="Kafka, audit store, Spark and alerts (default: KMQ_* env)"
    )
    sensors: Literal["running", "stopped"] = Field(
        default="running", description="whether the sensors run as soon as the code loads"
    )
    audit_retention_schedule: Literal["running", "stopped"] = Field(
        default="stopped", description="the daily audit retention deletes old rows"
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        specs = [queue.spec() for queue in self.queues]
        check_unique_names(specs)
        resources = self.resources.resources() if self.resources is not None else {}
        return kmq_definitions(
            specs,
            default_sensor_status=_STATUS[self.sensors],
            retention_schedule_status=_SCHEDULE[self.audit_retention_schedule],
            **resources,
        )
