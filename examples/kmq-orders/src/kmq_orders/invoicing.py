"""The per-message function of the orders queue: runs on the Spark executors, one call per
order. Returning acknowledges the order (its row goes to the output); raising sends it to the
queue's retry policy (a ``JSONDecodeError``, bad input, goes to the dead-letter topic at once).
"""

from __future__ import annotations

import json

from kmq_dagster import SparkMessage

#: Tax added to every order, in percent.
TAX_PERCENT = 20


def invoice_order(message: SparkMessage) -> dict[str, int]:
    """The order's total with tax, in cents."""
    order = json.loads(message.value or b"")
    return {"id": order["id"], "total_cents": order["amount_cents"] * (100 + TAX_PERCENT) // 100}
