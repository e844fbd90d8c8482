"""The ``defs`` Dagster loads through workspace.yaml (``dagster dev`` in the repo root): the
demo queue (``kmq demo``'s orders priced by group pricing), processed on local Spark.

It needs an embedded broker (``kmq broker``) and ``KMQ_BOOTSTRAP_SERVERS``; launch
``provision_orders__pricing`` (no config), or let the first processing run provision it.
``KMQ_DEMO_OUTPUT`` sets where the priced orders go (default under ``~/.kmq/demo/``);
``KMQ_ALERT_WEBHOOK_URL``, if set, receives the alerts as JSON.
"""

from __future__ import annotations

import os

from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.demo.orders import price_order
from kmq_dagster.demo.pipeline import DEMO_QUEUE, demo_home

#: Where the demo's processed orders are appended.
DEMO_OUTPUT = os.environ.get(
    "KMQ_DEMO_OUTPUT", str(demo_home() / "dagster" / "orders_priced.parquet")
)

DEMO_SPEC = QueueSpec(
    DEMO_QUEUE,
    function=price_order,
    output_path=DEMO_OUTPUT,
    max_messages_per_partition=20_000,
    backlog_interval_s=5,
    observation_interval_s=10,
    dead_letter_threshold=50,
    breaker=BreakerConfig(
        window_ms=30_000, min_calls=20, error_rate=0.5, cooldown_ms=20_000, probes=3
    ),
    breaker_interval_s=5,
    keepalive_interval_s=5,
)

defs = kmq_definitions(
    queues=[DEMO_SPEC],
    alerts=KmqAlertsResource(
        webhook_url=os.environ.get("KMQ_ALERT_WEBHOOK_URL") or None, min_period_s=60
    ),
)
