"""``KmqQueueComponent``: kmq queues declared in a ``dg`` project's ``defs.yaml``.

It builds what :func:`~kmq_dagster.defs.kmq_definitions` builds from Python (the same
functions): per queue the observed queue asset with its checks, the processing asset, the
provision, tracker, processing and operator jobs, the backlog, observation, breaker and
keep-alive sensors and the optional processing schedule; plus, once per code location, the
resources, the housekeeping jobs and the run-failure alert sensor. A project may hold any
number of these files (``dg scaffold defs kmq_dagster.KmqQueueComponent NAME`` once per
queue): they share one set of resources, each declared in one file or the same in several
(see :mod:`~kmq_dagster.components.location_share`).

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

import re
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import BaseModel, Field

from kmq_dagster.components.location_share import (
    components_of,
    location_share,
    merge_declarations,
    origin_of,
)
from kmq_dagster.components.queue_model import QueueModel
from kmq_dagster.components.resources_model import ResourcesModel
from kmq_dagster.defs.factory import kmq_resources, location_definitions, queue_definitions
from kmq_dagster.defs.queue_spec import check_unique_names

#: A defs.yaml document's ``type:`` line naming this component (any import path to it).
_KMQ_TYPE_LINE = re.compile(r"^type:\s*['\"]?[\w.]*KmqQueueComponent['\"]?\s*$", re.MULTILINE)

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
    """Writes a ``defs.yaml`` with one queue; the first kmq file of a project also declares
    the resources, read from the environment (later ones take them from it)."""

    @classmethod
    def get_scaffold_params(cls) -> type[KmqQueueScaffoldParams]:
        return KmqQueueScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[KmqQueueScaffoldParams]) -> None:
        from dagster.components.component_scaffolding import scaffold_component

        target, params = request.target_path, request.params
        attributes = starter_attributes(target, params, first=not kmq_files_beside(target))
        scaffold_component(request, attributes)


def starter_attributes(
    target: Path, params: KmqQueueScaffoldParams, *, first: bool = True
) -> dict[str, Any]:
    """What a freshly scaffolded ``defs.yaml`` declares: a queue named after its folder, no
    processing yet (add ``function`` and ``output_path``) and, in the ``first`` kmq file of a
    project, the resources from the environment (the code location's kmq files share them:
    a later file leaving them out takes the declared ones, whatever they have become)."""
    queue = {"topic": params.topic or target.name, "group": params.group}
    attributes: dict[str, Any] = {"queues": [{**queue, "partitions": params.partitions}]}
    if first:
        attributes["resources"] = {
            "kafka": {"bootstrap_servers": "{{ env.KMQ_BOOTSTRAP_SERVERS }}"},
            "audit": {"url": "{{ env.KMQ_AUDIT_URL }}"},
        }
    return attributes


def kmq_files_beside(target: Path) -> list[Path]:
    """The ``KmqQueueComponent`` files in the defs folder ``target`` is scaffolded into (the
    nearest folder above it named ``defs``; else ``target``'s parent)."""
    root = next((p for p in target.parents if p.name == "defs"), target.parent)
    found = []
    for path in sorted(root.rglob("defs.yaml")) if root.is_dir() else []:
        if path.parent == target or not _declares_kmq(path):
            continue
        found.append(path)
    return found


def _declares_kmq(path: Path) -> bool:
    try:
        return _KMQ_TYPE_LINE.search(path.read_text()) is not None
    except OSError:
        return False  # not ours to judge: dg check defs names that file's error


@dg.scaffold_with(KmqQueueScaffolder)
class KmqQueueComponent(dg.Component, dg.Resolvable, dg.Model):
    """Reliable Kafka work queues (kmq) processed on Spark, with sensors, checks and jobs."""

    queues: list[QueueModel] = Field(description="the queues this file declares")
    resources: ResourcesModel | None = Field(
        default=None,
        description="Kafka, audit store, Spark and alerts, shared by the code location's kmq "
        "files: each declared in one of them or the same in several (default: KMQ_* env)",
    )
    sensors: Literal["running", "stopped"] = Field(
        default="running", description="whether this file's sensors run as soon as the code loads"
    )
    audit_retention_schedule: Literal["running", "stopped"] = Field(
        default="stopped",
        description="the daily audit retention deletes old rows (one setting per code location)",
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        specs = [queue.spec() for queue in self.queues]
        check_unique_names(specs)
        share = location_share(context)
        origin = origin_of(context.component_path, context.defs_module_path)
        share.claim_queues(origin, specs)
        location, owned = share.once(origin, lambda: location_of(context, (origin, self)))
        per_queue = [
            queue_definitions(spec, default_sensor_status=_STATUS[self.sensors]) for spec in specs
        ]
        # every component hands Dagster the same resources object (it merges resources by
        # identity); the location's jobs, schedules and sensor come from one component only
        shared = location if owned else dg.Definitions(resources=location.resources)
        return dg.Definitions.merge(*per_queue, shared)

    def location_settings(self) -> dict[str, Any]:
        """The code-location-wide settings this file declares (one it leaves out is absent)."""
        declared: dict[str, Any] = {}
        if self.resources is not None:
            for name, model in self.resources.given().items():
                declared[f"resources.{name}"] = model
        if "audit_retention_schedule" in self.model_fields_set:
            declared["audit_retention_schedule"] = self.audit_retention_schedule
        return declared


def location_of(
    context: dg.ComponentLoadContext, building: tuple[str, KmqQueueComponent]
) -> dg.Definitions:
    """The code location's shared definitions, from the settings of all its kmq files
    (``building``, the one being built, among them): the resources, the daily jobs and
    schedules, and the run-failure sensor (running unless every file says ``sensors:
    stopped``)."""
    files = components_of(context, KmqQueueComponent)
    if building[0] not in {origin for origin, _ in files}:
        files.append(building)  # built outside the project's tree of files
    settings = merge_declarations([(origin, c.location_settings()) for origin, c in files])
    resources = ResourcesModel(
        **{name: settings.get(f"resources.{name}") for name in ResourcesModel.model_fields}
    )
    sensors = "stopped" if all(c.sensors == "stopped" for _, c in files) else "running"
    return location_definitions(
        kmq_resources(**resources.resources()),
        monitored_jobs=None,  # other components' jobs too: every run with a kmq/ tag
        default_sensor_status=_STATUS[sensors],
        retention_schedule_status=_SCHEDULE[settings.get("audit_retention_schedule", "stopped")],
    )
