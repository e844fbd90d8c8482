"""Kafka clients handed out to a caller that closes them all at once (a Dagster resource's
teardown), so that the caller need not import confluent-kafka itself."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Producer

from kmq_dagster.kafka.clients import new_consumer, new_producer
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S
from kmq_dagster.settings import KmqSettings

__all__ = ["Consumer", "OwnedClients", "Producer"]


class OwnedClients:
    """The clients made through it, until :meth:`close`."""

    def __init__(self) -> None:
        self._producers: list[Producer] = []
        self._consumers: list[Consumer] = []

    def producer(self, settings: KmqSettings, **extra: Any) -> Producer:
        """An idempotent producer, flushed and dropped by :meth:`close`."""
        producer = new_producer(settings, **extra)
        self._producers.append(producer)
        return producer

    def consumer(self, settings: KmqSettings, group: str, **extra: Any) -> Consumer:
        """A consumer in ``group`` that never commits on its own, closed by :meth:`close`."""
        consumer = new_consumer(settings, group, **extra)
        self._consumers.append(consumer)
        return consumer

    def close(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Flush every producer (up to ``timeout_s`` each) and close every consumer."""
        for producer in self._producers:
            producer.flush(timeout_s)
        for consumer in self._consumers:
            consumer.close()
        self._producers.clear()
        self._consumers.clear()
