"""Functions for `kmq spark` in process-level tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kmq_dagster.spark.tasks import SparkMessage

#: Seconds each call takes.
WORK_S = float(os.environ.get("KMQ_TEST_WORK_S", "0.002"))
#: From this offset of the queue topic on, the function signals and then hangs, so that a test
#: can kill the driver while a batch is in flight (its start markers written, nothing acked).
HANG_FROM_OFFSET = int(os.environ.get("KMQ_TEST_HANG_FROM_OFFSET", "-1"))
HANGING_FLAG = os.environ.get("KMQ_TEST_HANGING_FLAG", "")


def slow_echo(message: SparkMessage) -> str:
    if 0 <= HANG_FROM_OFFSET <= message.offset and message.topic.count(".") == 0:
        Path(HANGING_FLAG).touch()
        time.sleep(3_600)
    time.sleep(WORK_S)
    return (message.value or b"").decode()


def where_it_ran(message: SparkMessage) -> dict[str, object]:
    """Every tenth message is bad input; the others report the process and directory that ran
    them (on a standalone cluster: an executor's work directory under its worker's)."""
    number = int(message.value or b"-1")
    if number % 10 == 0:
        raise ValueError(f"{number} is not allowed")
    return {"n": number, "pid": os.getpid(), "cwd": os.getcwd()}


def slow_price(message: SparkMessage) -> object:
    """The demo's pricing, 10 ms per message: long enough for two runs to overlap."""
    from kmq_dagster.demo.orders import price_order

    time.sleep(0.01)
    return price_order(message)
