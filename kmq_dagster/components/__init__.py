"""Dagster Components of kmq: queues declared in a ``dg`` project's YAML.

``KmqQueueComponent`` is also importable as ``kmq_dagster.KmqQueueComponent``, the type name a
``defs.yaml`` uses; kmq-dagster registers it with ``dg`` (``dg list components``).
"""

from __future__ import annotations

from kmq_dagster.components.queue_component import KmqQueueComponent

__all__ = ["KmqQueueComponent"]
