"""Building a queue's definitions on the test broker, producing demo orders to it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Definitions, SensorDefinition
from dagster_pyspark import PySparkResource

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.demo.orders import order_value, price_order
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import produce
from tests.dagster.conftest import tick


def group_for(topic: str) -> str:
    """A consumer group of the test's own: tests share one broker, and members of one group
    id on other topics would rebalance with this test's consumers."""
    return f"pricing-{topic[-8:]}"


@dataclass
class QueueUnderTest:
    """A declared queue, its definitions and the resources they run with."""

    spec: QueueSpec
    defs: Definitions
    resources: dict[str, Any]
    instance: DagsterInstance

    def sensor(self, prefix: str) -> SensorDefinition:
        return self.defs.get_repository_def().get_sensor_def(self.spec.job_name(prefix))

    def tick(self, prefix: str, cursor: str | None = None) -> Any:
        return tick(self.sensor(prefix), self.defs, self.instance, self.resources, cursor)

    def provision(self) -> None:
        job = self.defs.resolve_job_def(self.spec.job_name("provision"))
        assert job.execute_in_process(instance=self.instance).success


def declare(
    topic: str,
    tmp_path: Path,
    instance: DagsterInstance,
    kmq: KmqResource,
    audit: AuditStoreResource,
    pyspark: PySparkResource | None = None,
    **spec_fields: Any,
) -> QueueUnderTest:
    """The demo pricing function on ``topic`` (2 partitions, retries after 1 s unless a
    ``retry_policy`` is given), provisioned."""
    definition: dict[str, Any] = {
        "partitions": 2,
        "retry_policy": spec_fields.pop("retry_policy", RetryPolicy.fixed((1_000,))),
        "visibility_timeout_ms": spec_fields.pop("visibility_timeout_ms", 30_000),
        "max_redeliveries": spec_fields.pop("max_redeliveries", 3),
    }
    spec = QueueSpec(
        Queue(topic, group_for(topic), **definition),
        function=spec_fields.pop("function", price_order),
        output_path=str(tmp_path / "priced.parquet"),
        **spec_fields,
    )
    resources: dict[str, Any] = {"kmq": kmq, "audit": audit}
    if pyspark is not None:
        resources["pyspark"] = pyspark
    defs = kmq_definitions([spec], kmq=kmq, audit=audit, pyspark=pyspark)
    under_test = QueueUnderTest(spec, defs, resources, instance)
    under_test.provision()
    return under_test


def produce_orders(kmq: KmqResource, topic: str, ids: range) -> None:
    """The demo's orders with these ids (id % 20 == 3 is poison, == 11 fails once)."""
    producer = new_producer(kmq.get_settings())
    for order_id in ids:
        produce(producer, topic, key=str(order_id).encode(), value=order_value(order_id))
    assert producer.flush(30) == 0
