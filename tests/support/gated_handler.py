"""A handler whose calls wait at a gate, so a test can hold calls in flight and let them go.

A message whose value is ``NAME-...`` waits while ``$KMQ_TEST_OUTPUT_DIR/closed-NAME`` exists
(checked every 5 ms); values without such a file pass at once. Each call writes
``start VALUE TOPIC:PARTITION`` and, before returning, ``ok VALUE TOPIC:PARTITION`` to
``gated-<pid>.log`` there, one ``write`` per line on an ``O_APPEND`` descriptor (whole lines,
in the order written, across threads).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage
from tests.support import worker_pid

_lock = threading.Lock()
_output: dict[int, int] = {}


def gate_of(out_dir: Path, name: str) -> Path:
    """The file that holds ``name-...`` messages while it exists."""
    return out_dir / f"closed-{name}"


def handle(message: KmqMessage) -> None:
    out_dir = Path(os.environ["KMQ_TEST_OUTPUT_DIR"])
    value = (message.value or b"").decode()
    line = f"{value} {message.topic}:{message.partition}\n"
    write_line(out_dir, "start " + line)
    gate = gate_of(out_dir, value.partition("-")[0])
    while gate.exists():
        time.sleep(0.005)
    write_line(out_dir, "ok " + line)


def write_line(out_dir: Path, text: str) -> None:
    """Append ``text`` (whole lines) to this worker's ``gated-<pid>.log`` in ``out_dir``."""
    pid = worker_pid()
    with _lock:
        if pid not in _output:
            path = out_dir / f"gated-{pid}.log"
            _output[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_output[pid], text.encode())
