"""kmq-dagster: a reliable work queue on Apache Kafka.

Per-message acknowledgement, redelivery after a visibility timeout, non-blocking retries,
a delay queue, dead-letter topics and replay, and a circuit breaker; processing on PySpark,
operated from Dagster. Everything a Python user needs is importable from here::

    from kmq_dagster import KmqSettings, Queue, RetryPolicy, Worker, open_queue, provision_queue

    settings = KmqSettings.from_env()
    provision_queue(settings, Queue("orders", "billing", partitions=8,
                                    retry_policy=RetryPolicy.fixed([10_000, 60_000])))
    opened = open_queue(settings, "orders", "billing")  # the stored definition, checked once
    Worker(opened, handle).run(stop_event)

Every component (consumer, tracker, worker, Spark job, replay, DLQ ingester) takes the
:class:`OpenedQueue` that ``open_queue`` (or ``provision_queue(...).opened``) returns.

Names are imported on first use, so ``import kmq_dagster`` is cheap and pulls in neither
confluent-kafka, SQLAlchemy, PySpark nor Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kmq_dagster.errors import (
    AuditStoreError,
    BrokerError,
    ConfigError,
    DeliveryError,
    KafkaAuthError,
    KafkaUnavailableError,
    KmqError,
    KmqTimeoutError,
    MarkerDecodeError,
    PermissionDeniedError,
    ProvisionError,
    QueueConflictError,
)

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported when the name is first used).
_LAZY = {
    "KmqSettings": "kmq_dagster.settings",
    "Queue": "kmq_dagster.core.queue",
    "RetryPolicy": "kmq_dagster.core.retry",
    "BreakerConfig": "kmq_dagster.core.breaker",
    "ReplaySelection": "kmq_dagster.core.replay",
    "KmqConsumer": "kmq_dagster.kafka.consumer",
    "KmqMessage": "kmq_dagster.kafka.message",
    "KmqProducer": "kmq_dagster.kafka.producer",
    "RedeliveryTracker": "kmq_dagster.kafka.redelivery_tracker",
    "RetryRouter": "kmq_dagster.kafka.retry_router",
    "Worker": "kmq_dagster.worker.worker",
    "WorkerStats": "kmq_dagster.worker.worker",
    "HandlerExit": "kmq_dagster.worker.worker",
    "DelayForwarder": "kmq_dagster.kafka.delay_forwarder",
    "DlqIngester": "kmq_dagster.operations.dlq_ingester",
    "ReplayRequest": "kmq_dagster.core.replay_request",
    "ReplayReport": "kmq_dagster.core.replay_request",
    "replay_dead_letters": "kmq_dagster.operations.replay",
    "provision_queue": "kmq_dagster.kafka.provision",
    "provision_topic": "kmq_dagster.kafka.provision",
    "open_queue": "kmq_dagster.kafka.queues",
    "OpenedQueue": "kmq_dagster.kafka.opened_queue",
    "AuditStore": "kmq_dagster.audit.store",
    "DeadLetterFilter": "kmq_dagster.audit.store",
    "SharedBreaker": "kmq_dagster.audit.shared_breaker",
    "breaker_config": "kmq_dagster.audit.shared_breaker",
    "EmbeddedBroker": "kmq_dagster.broker.embedded",
    "SparkQueueJob": "kmq_dagster.spark.job",
    "SparkMessage": "kmq_dagster.spark.tasks",
    "KmqQueueComponent": "kmq_dagster.components.queue_component",
    "Ordering": "kmq_dagster.core.ordering",
    "ValueFormat": "kmq_dagster.core.value_formats",
    "ValueCodec": "kmq_dagster.schemas.codec",
    "RegistrySettings": "kmq_dagster.schemas.registry",
    "UndecodableValue": "kmq_dagster.schemas.wire",
    "RegistryUnavailable": "kmq_dagster.schemas.wire",
}

__all__ = [
    "AuditStore",
    "AuditStoreError",
    "BreakerConfig",
    "BrokerError",
    "ConfigError",
    "DeadLetterFilter",
    "DelayForwarder",
    "DeliveryError",
    "DlqIngester",
    "EmbeddedBroker",
    "HandlerExit",
    "KafkaAuthError",
    "KafkaUnavailableError",
    "KmqConsumer",
    "KmqError",
    "KmqMessage",
    "KmqProducer",
    "KmqQueueComponent",
    "KmqSettings",
    "KmqTimeoutError",
    "MarkerDecodeError",
    "OpenedQueue",
    "Ordering",
    "PermissionDeniedError",
    "ProvisionError",
    "Queue",
    "QueueConflictError",
    "RedeliveryTracker",
    "RegistrySettings",
    "RegistryUnavailable",
    "ReplayReport",
    "ReplayRequest",
    "ReplaySelection",
    "RetryPolicy",
    "RetryRouter",
    "SharedBreaker",
    "SparkMessage",
    "SparkQueueJob",
    "UndecodableValue",
    "ValueCodec",
    "ValueFormat",
    "Worker",
    "WorkerStats",
    "__version__",
    "breaker_config",
    "open_queue",
    "provision_queue",
    "provision_topic",
    "replay_dead_letters",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kmq_dagster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from kmq_dagster.audit.shared_breaker import SharedBreaker, breaker_config
    from kmq_dagster.audit.store import AuditStore, DeadLetterFilter
    from kmq_dagster.broker.embedded import EmbeddedBroker
    from kmq_dagster.components.queue_component import KmqQueueComponent
    from kmq_dagster.core.breaker import BreakerConfig
    from kmq_dagster.core.ordering import Ordering
    from kmq_dagster.core.queue import Queue
    from kmq_dagster.core.replay import ReplaySelection
    from kmq_dagster.core.retry import RetryPolicy
    from kmq_dagster.core.value_formats import ValueFormat
    from kmq_dagster.kafka.consumer import KmqConsumer
    from kmq_dagster.kafka.delay_forwarder import DelayForwarder
    from kmq_dagster.kafka.message import KmqMessage
    from kmq_dagster.kafka.opened_queue import OpenedQueue
    from kmq_dagster.kafka.producer import KmqProducer
    from kmq_dagster.kafka.provision import provision_queue, provision_topic
    from kmq_dagster.kafka.queues import open_queue
    from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
    from kmq_dagster.kafka.retry_router import RetryRouter
    from kmq_dagster.operations.dlq_ingester import DlqIngester
    from kmq_dagster.operations.replay import ReplayReport, ReplayRequest, replay_dead_letters
    from kmq_dagster.schemas.codec import ValueCodec
    from kmq_dagster.schemas.registry import RegistrySettings
    from kmq_dagster.schemas.wire import RegistryUnavailable, UndecodableValue
    from kmq_dagster.settings import KmqSettings
    from kmq_dagster.spark.job import SparkQueueJob
    from kmq_dagster.spark.tasks import SparkMessage
    from kmq_dagster.worker.worker import HandlerExit, Worker, WorkerStats
