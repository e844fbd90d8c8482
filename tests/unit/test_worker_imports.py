"""A worker loads no SQL: ``from kmq_dagster import Worker`` (what every worker process, Dagster
run and autoscaled replica pays) imports neither the audit store nor SQLAlchemy; the breaker it
obeys is a protocol in ``core``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import kmq_dagster.kafka
import kmq_dagster.worker

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


COMMAND_LOADED = """
import sys
import kmq_dagster.cli
sql = [m for m in sys.modules if m == "sqlalchemy" or m.startswith("kmq_dagster.audit")]
print(",".join(sorted(sql)))
"""


def test_the_kmq_command_loads_no_audit_store_until_a_command_needs_it() -> None:
    """Every ``kmq tracker``, ``kmq worker`` and ``kmq delayer`` process loads the command first:
    SQLAlchemy and the store models cost ~35 MB of resident memory and over a second of start
    (a tracker with 100,000 messages in flight peaked at 94 MB with them, 61 MB without).
    Only the commands that use the store (replay, ingest, dlq, console) import it, when run."""
    result = subprocess.run(
        [sys.executable, "-c", COMMAND_LOADED],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip() == "", f"importing the kmq command loaded: {result.stdout.strip()}"


@pytest.mark.parametrize(
    "package", [kmq_dagster.kafka, kmq_dagster.worker], ids=["kafka", "worker"]
)
def test_no_module_of_the_kafka_and_worker_packages_imports_the_audit_store_or_sqlalchemy(
    package: ModuleType,
) -> None:
    """``kafka/`` holds the clients and the queue protocol, ``worker/`` the loops over them;
    whatever also needs the store lives in ``operations/``, a floor above both (read from the
    source, so an import inside a function counts as well)."""
    found = [
        f"{path.name}: {name}"
        for path in sorted(Path(package.__file__ or "").parent.glob("*.py"))
        for name in imported_names(path)
        if name == "sqlalchemy" or name.startswith(("sqlalchemy.", "kmq_dagster.audit"))
    ]
    assert found == []


def imported_names(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names
