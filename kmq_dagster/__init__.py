"""kmq-dagster: a reliable work queue on Apache Kafka.

Per-message acknowledgement, redelivery after a visibility timeout, non-blocking retries,
dead-letter queues and replay, run with PySpark and operated from Dagster.
"""

from __future__ import annotations

__version__ = "0.1.0"
