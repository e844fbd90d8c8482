"""A handler for process-level tests: records each message it processed, fails ~10% of calls.

Every call appends the message value as one line to ``$KMQ_TEST_OUTPUT_DIR/calls-<pid>.log``,
and every successful call to ``processed-<pid>.log`` *before* returning, so the record exists
before the acknowledgement (ack after effect) and survives a SIGKILL of the worker.
"""

from __future__ import annotations

import os
import random
import time

from kmq_dagster.kafka.consumer import KmqMessage
from tests.support import worker_pid

_rng = random.Random()
#: Output files by (pid, kind), opened on first use (a forked worker opens its own).
_outputs: dict[tuple[int, str], int] = {}

#: Share of calls that raise.
FAILURE_RATE = float(os.environ.get("KMQ_TEST_FAILURE_RATE", "0.1"))
#: Seconds each call takes, so that a SIGKILL lands mid-batch.
WORK_S = float(os.environ.get("KMQ_TEST_WORK_S", "0.0005"))


class FlakyDependencyError(RuntimeError):
    """The simulated downstream failure."""


def handle(message: KmqMessage) -> None:
    time.sleep(WORK_S)
    _record("calls", message)
    if _rng.random() < FAILURE_RATE:
        raise FlakyDependencyError("simulated failure")
    _record("processed", message)


def _record(kind: str, message: KmqMessage) -> None:
    key = (worker_pid(), kind)
    if key not in _outputs:
        path = os.path.join(os.environ["KMQ_TEST_OUTPUT_DIR"], f"{kind}-{key[0]}.log")
        _outputs[key] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_outputs[key], (message.value or b"<null>") + b"\n")
