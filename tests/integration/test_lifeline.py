"""A process's lifeline tells when a process it runs under is gone: real processes, a middle
one killed with SIGKILL (as a killed ``dg dev`` is), the watcher below it notices and ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from kmq_dagster.child_processes import is_running
from tests.kafka_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

#: Watches its lifeline every 0.1 s; says what it lost, then ends.
WATCHER = """
import time
from kmq_dagster.child_processes import Lifeline
lifeline = Lifeline()
print("watching", *lifeline.pids, flush=True)
while (lost := lifeline.lost()) is None:
    time.sleep(0.1)
print("lost", lost, flush=True)
"""

#: Starts the watcher, prints its pid, and waits to be killed.
MIDDLE = """
import subprocess, sys, time
watcher = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=open(sys.argv[2], "w"))
print(watcher.pid, flush=True)
time.sleep(3600)
"""


def test_the_watcher_ends_when_a_process_above_it_is_killed(tmp_path: Path) -> None:
    said = tmp_path / "watcher.out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, WATCHER, str(said)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    watcher = 0
    try:
        assert middle.stdout is not None
        watcher = int(middle.stdout.readline())
        assert wait_for(lambda: said.read_text().startswith("watching"), timeout_s=60)
        assert said.read_text().split()[1:3] == [str(middle.pid), str(os.getpid())]
        assert is_running(watcher)

        middle.kill()
        middle.wait(30)

        assert wait_for(lambda: not is_running(watcher), timeout_s=30, interval_s=0.1)
        assert f"(pid {middle.pid})" in said.read_text().split("\nlost ", 1)[1]
    finally:
        middle.kill()
        middle.wait(30)
        if watcher:
            with contextlib.suppress(ProcessLookupError):
                os.kill(watcher, signal.SIGKILL)
