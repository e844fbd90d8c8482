"""A handler module whose import waits for a file: a worker stopped while it starts.

Importing it writes ``importing`` (its PID) into ``KMQ_TEST_OUTPUT_DIR``, then waits up to
120 s for ``go`` to appear there. A stop signal meanwhile finds the worker before it has set
up its own stop handling (the handler is imported first), as one sent in a worker's first
moments does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage

_OUT_DIR = Path(os.environ["KMQ_TEST_OUTPUT_DIR"])
(_OUT_DIR / "importing").write_text(str(os.getpid()))
_deadline = time.monotonic() + 120
while not (_OUT_DIR / "go").exists() and time.monotonic() < _deadline:
    time.sleep(0.05)


def handle(message: KmqMessage) -> None:
    """Acknowledges every message."""
