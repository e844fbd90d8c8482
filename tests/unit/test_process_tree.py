"""What tests and ``kmq bench`` read of a process tree from ``/proc``: every descendant, not
only children, and a zombie counts as stopped (it holds no sockets any more)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from kmq_dagster.child_processes import descendants, is_running
from tests.kafka_helpers import wait_for

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")

# A child that starts a grandchild, prints its PID, and waits.
_PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_descendants_reach_a_grandchild_and_a_zombie_is_not_running() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert descendants(parent.pid) == {grandchild}
        assert descendants(os.getpid()) >= {parent.pid, grandchild}
        assert is_running(grandchild)
        os.kill(grandchild, signal.SIGKILL)  # its parent never waits: it stays a zombie
        assert wait_for(lambda: not is_running(grandchild), timeout_s=10)
        assert grandchild in descendants(parent.pid), "a zombie is still a child"
    finally:
        for pid in (grandchild, parent.pid):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=30)
    assert not is_running(parent.pid)
    assert descendants(parent.pid) == set()
