"""A service of child process groups stops what it spawned when its start fails half-way
(the Dagster service used to leave its webserver running then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kmq_dagster.child_processes import spawn_in_group, stop_groups
from kmq_dagster.core.lifecycle import Service


class HalfStarted(Service):
    """Spawns one child, then fails as a service whose second process does not come up."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self) -> HalfStarted:
        argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        self.children.append(spawn_in_group(argv, log_file=self.log_file, env={}))
        raise RuntimeError("the second process did not come up")

    def stop(self, timeout_s: float = 30) -> None:
        stop_groups(self.children, timeout_s)


def test_a_start_that_fails_half_way_leaves_no_child_running(tmp_path: Path) -> None:
    service = HalfStarted(tmp_path / "service.log")
    with pytest.raises(RuntimeError, match="did not come up"), service:
        pass
    (child,) = service.children
    assert child.poll() is not None, "the child spawned before the failure is still running"
