"""Files that several processes of a test (Spark executors, workers) append lines to."""

from __future__ import annotations

import os


def append_line(path: str, line: str) -> None:
    """Append ``line`` to the file at ``path``, created if missing.

    One write per line on an ``O_APPEND`` descriptor: lines of several processes never mix.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)
