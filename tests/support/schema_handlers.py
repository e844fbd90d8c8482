"""A handler for `kmq worker` subprocess tests of Schema Registry values."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record(message: Any) -> None:
    """Append the decoded value, as JSON, to ``$KMQ_TEST_OUTPUT_DIR/decoded.txt``."""
    with (Path(os.environ["KMQ_TEST_OUTPUT_DIR"]) / "decoded.txt").open("a") as out:
        out.write(json.dumps(message.decoded()) + "\n")
