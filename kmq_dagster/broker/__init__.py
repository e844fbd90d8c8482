"""The embedded Kafka-compatible broker (Tansu), optionally durable on a local SeaweedFS."""

from __future__ import annotations

from kmq_dagster.broker.embedded import EmbeddedBroker

__all__ = ["EmbeddedBroker"]
