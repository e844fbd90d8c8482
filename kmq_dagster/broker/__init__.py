"""The embedded Kafka-compatible broker (Tansu), optionally durable on a local SeaweedFS.

``EmbeddedBroker`` is imported on first use: every Kafka client imports ``broker.probe`` (to
say "no broker at ..." at once), and the broker's own module with its HTTP and archive imports
took about a quarter of a second of ``from kmq_dagster import Worker``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kmq_dagster.broker.embedded import EmbeddedBroker

__all__ = ["EmbeddedBroker"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBroker":
        from kmq_dagster.broker.embedded import EmbeddedBroker

        return EmbeddedBroker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
