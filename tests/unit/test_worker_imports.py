"""A worker loads no SQL: ``from kmq_dagster import Worker`` (what every worker process, Dagster
run and autoscaled replica pays) imports neither the audit store nor SQLAlchemy; the breaker it
obeys is a protocol in ``core``."""

from __future__ import annotations

import subprocess
import sys

LOADED = """
import sys
from kmq_dagster import Worker, open_queue
Worker, open_queue
sql = [m for m in sys.modules if m == "sqlalchemy" or m.startswith("kmq_dagster.audit")]
print(",".join(sorted(sql)))
"""


def test_importing_the_worker_loads_no_audit_store_and_no_sqlalchemy() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "", f"a worker import loaded: {result.stdout.strip()}"
