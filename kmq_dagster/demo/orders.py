"""The sample order stream of ``kmq demo`` and the Spark function that prices each order.

About 5% of orders are poison (not JSON: dead-lettered at once) and about 5% hit a transient
failure on their first attempt (the payment service times out; the retry succeeds). While the
file named by ``KMQ_DEMO_OUTAGE_FILE`` exists, every order fails: the payment service is down
(``kmq demo --ui`` scripts such an outage to show the circuit breaker).
"""

from __future__ import annotations

import json
import os

from kmq_dagster.core.retry_headers import read_attempt
from kmq_dagster.spark.tasks import SparkMessage

#: While the file this variable names exists, the payment service is down.
OUTAGE_FILE_VARIABLE = "KMQ_DEMO_OUTAGE_FILE"


class PaymentTimeout(RuntimeError):
    """The simulated transient failure."""


class PaymentServiceDown(RuntimeError):
    """The simulated outage: every order fails until it is over."""


def outage_now() -> bool:
    """Whether the scripted outage is on (its file exists)."""
    path = os.environ.get(OUTAGE_FILE_VARIABLE)
    return path is not None and os.path.exists(path)


def is_poison(order_id: int) -> bool:
    return order_id % 20 == 3


def is_flaky(order_id: int) -> bool:
    return order_id % 20 == 11


def order_value(order_id: int) -> bytes:
    if is_poison(order_id):
        return f"<order {order_id} truncated".encode()
    return json.dumps({"id": order_id, "amount_cents": 1_000 + order_id % 997}).encode()


def price_order(message: SparkMessage) -> dict[str, int]:
    """Add 20% tax; runs on the Spark executors."""
    if outage_now():
        raise PaymentServiceDown("payment service unavailable")
    order = json.loads(message.value or b"")  # poison: JSONDecodeError, never retried
    if is_flaky(order["id"]) and read_attempt(message.headers) == 1:
        raise PaymentTimeout("payment service timed out")
    return {"id": order["id"], "total_cents": order["amount_cents"] * 6 // 5}
