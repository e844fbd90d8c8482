"""A handler whose call never comes back to Python: C code that holds the GIL for hours.

Each call writes ``start VALUE TOPIC:PARTITION`` to ``gated-<pid>.log`` (as
:mod:`tests.support.gated_handler` does), then sums a repeat of ten trillion ones: ``sum``'s
loop over small ints runs in C without letting the GIL go or checking for signals, so in that
process no signal handler and no other thread runs Python until it ends.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage
from tests.support.gated_handler import write_line


def handle(message: KmqMessage) -> None:
    out_dir = Path(os.environ["KMQ_TEST_OUTPUT_DIR"])
    value = (message.value or b"").decode()
    write_line(out_dir, f"start {value} {message.topic}:{message.partition}\n")
    sum(itertools.repeat(1, 10**13))
