"""The handler ``kmq bench faults`` runs in its ``kmq worker`` processes.

Each successful call appends the message value as one line to
``$KMQ_FAULT_DIR/processed-<pid>.log`` *before* returning (ack after effect), so what a worker
processed survives its SIGKILL. A share ``$KMQ_FAULT_FAILURE_RATE`` of calls raises
:class:`FlakyDependencyError` (retried) and appends to ``failed-<pid>.log``; values starting
with ``poison`` raise :class:`PoisonMessageError` (the bench makes it non-retryable).
``$KMQ_FAULT_WORK_MS`` is how long each call takes, so kills land mid-batch.
"""

from __future__ import annotations

import os
import random
import time

from kmq_dagster.kafka.message import KmqMessage

#: Environment variables the handler reads.
OUTPUT_DIR_ENV = "KMQ_FAULT_DIR"
FAILURE_RATE_ENV = "KMQ_FAULT_FAILURE_RATE"
WORK_MS_ENV = "KMQ_FAULT_WORK_MS"
#: What ``kmq worker --handler`` is given.
HANDLER_SPEC = "kmq_dagster.bench.fault_handler:handle"
#: Values with this prefix are poison: the handler always fails on them, fatally.
POISON_PREFIX = b"poison"

_rng = random.Random()
_files: dict[str, int] = {}


class FlakyDependencyError(RuntimeError):
    """The simulated failure of a downstream dependency (retryable)."""


class PoisonMessageError(ValueError):
    """A message no retry can fix (the bench's workers treat it as non-retryable)."""


def _append(kind: str, value: bytes) -> None:
    name = f"{kind}-{os.getpid()}.log"
    handle = _files.get(name)
    if handle is None:
        path = os.path.join(os.environ[OUTPUT_DIR_ENV], name)
        handle = _files[name] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(handle, value + b"\n")


def handle(message: KmqMessage) -> None:
    """Process one message of a fault scenario (see the module docstring)."""
    work_ms = float(os.environ.get(WORK_MS_ENV, "0"))
    if work_ms:
        time.sleep(work_ms / 1000)
    value = message.value or b"<null>"
    if value.startswith(POISON_PREFIX):
        _append("failed", value)
        raise PoisonMessageError(f"cannot process {value[:40]!r}")
    if _rng.random() < float(os.environ.get(FAILURE_RATE_ENV, "0")):
        _append("failed", value)
        raise FlakyDependencyError("simulated failure of a dependency")
    _append("processed", value)
