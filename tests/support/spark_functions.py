"""Functions for `kmq spark` in process-level tests."""

from __future__ import annotations

import os
import time

from kmq_dagster.spark.tasks import SparkMessage

#: Seconds each call takes, so that a SIGKILL lands mid-batch.
WORK_S = float(os.environ.get("KMQ_TEST_WORK_S", "0.002"))


def slow_echo(message: SparkMessage) -> str:
    time.sleep(WORK_S)
    return (message.value or b"").decode()
