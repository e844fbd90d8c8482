"""A `kmq worker` handler that records the garbage collector's first threshold it runs under
(``KMQ_TEST_OUTPUT_DIR``/gc_threshold.txt, a line a message)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage


def record(_message: KmqMessage) -> None:
    with (Path(os.environ["KMQ_TEST_OUTPUT_DIR"]) / "gc_threshold.txt").open("a") as out:
        out.write(f"{gc.get_threshold()[0]}\n")
