"""A handler for the key-order checker: logs each call's start and end, sleeps 0-5 ms, fails
~10% of calls with a retryable error.

Lines go to ``$KMQ_TEST_OUTPUT_DIR/keyed-<pid>.log`` with one ``write`` each on an ``O_APPEND``
descriptor, so the file's line order is the order the calls wrote them in, across threads:
``start KEY TOPIC:PARTITION:OFFSET VALUE``, then ``ok ...`` (before returning, so the record
exists before the acknowledgement) and ``end ...`` (before returning or raising).
"""

from __future__ import annotations

import os
import random
import threading
import time

from kmq_dagster.kafka.consumer import KmqMessage
from tests.support import worker_pid

FAILURE_RATE = float(os.environ.get("KMQ_TEST_FAILURE_RATE", "0.1"))
MAX_WORK_S = float(os.environ.get("KMQ_TEST_MAX_WORK_S", "0.005"))

_rng = random.Random()
_lock = threading.Lock()
_output: dict[int, int] = {}


class FlakyDependencyError(RuntimeError):
    """The simulated downstream failure (retryable)."""


def handle(message: KmqMessage) -> None:
    where = f"{(message.key or b'-').decode()} {message.topic}:{message.partition}:{message.offset}"
    line = f"{where} {(message.value or b'').decode()}\n"
    _write("start " + line)
    try:
        time.sleep(_rng.uniform(0, MAX_WORK_S))
        if _rng.random() < FAILURE_RATE:
            raise FlakyDependencyError("simulated failure")
        _write("ok " + line)
    finally:
        _write("end " + line)


def _write(text: str) -> None:
    pid = worker_pid()
    with _lock:
        if pid not in _output:
            path = os.path.join(os.environ["KMQ_TEST_OUTPUT_DIR"], f"keyed-{pid}.log")
            _output[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_output[pid], text.encode())
