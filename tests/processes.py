"""Helpers for tests that run ``kmq`` as a real process and must stop it by PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kmq_dagster.child_processes import descendants

_BOOTSTRAP_LINE = re.compile(r"export KMQ_BOOTSTRAP_SERVERS=(\S+)")


def kmq_argv(*args: str) -> list[str]:
    """argv running the ``kmq`` command with this interpreter."""
    return [sys.executable, "-m", "kmq_dagster.cli", *args]


def run_kmq(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``kmq`` to completion and capture its output."""
    return subprocess.run(
        kmq_argv(*args),
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class BrokerProcess:
    """``kmq broker`` running as a child process, with the address it printed."""

    def __init__(self, *args: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.popen = subprocess.Popen(
            kmq_argv("broker", *args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.bootstrap_servers = self._wait_for_address(timeout_s=90)

    def _wait_for_address(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _BOOTSTRAP_LINE.search(self.log_path.read_text())
            if match:
                return match.group(1)
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"kmq broker did not start:\n{self.log_path.read_text()}")

    def child_pids(self) -> set[int]:
        """PIDs of every descendant of the ``kmq broker`` process."""
        return descendants(self.popen.pid)

    def terminate(self, timeout_s: float = 60, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGTERM; SIGINT is Ctrl-C), wait for exit, return the exit code."""
        self.popen.send_signal(sig)
        code = self.popen.wait(timeout=timeout_s)
        self._log.close()
        return code

    def stop_expecting(self, code: int = 0, sig: signal.Signals = signal.SIGTERM) -> None:
        """:meth:`terminate` and assert the exit code; a broker that exited otherwise (a child
        of its that died, say) shows what it printed, its children's log tails included."""
        exit_code = self.terminate(sig=sig)
        assert exit_code == code, (
            f"kmq broker exited with {exit_code}, not {code}; it printed:\n"
            f"{self.log_path.read_text(errors='replace')}"
        )

    def kill(self) -> None:
        """SIGKILL the process and every descendant (cleanup after a failed test)."""
        for pid in [*descendants(self.popen.pid), self.popen.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait(timeout=30)
        self._log.close()


def stacks_in_log(process: subprocess.Popen[Any], log: Path, timeout_s: float = 15) -> str:
    """Ask a ``kmq`` process that does not stop for every thread's stack (``kill -USR1``,
    which a long-lived command answers on stderr) and return the end of ``log`` once they
    are written there: what a test that timed out on it shows."""
    from kmq_dagster.crash_guard import supervised_pid
    from tests.kafka_helpers import wait_for

    def main_stacks() -> int:
        # A process's dump ends with its main thread's stack, whose first frame is a module's
        return log.read_text(errors="replace").count(" in <module>\n")

    # Wait for this request's stacks, not an earlier dump's (a test that asked once already
    # showed its stacks from before the step that hung), and for all of them: a supervisor
    # writes its own, then its command's, main thread last (CI once showed a cut dump).
    processes = 2 if supervised_pid(process.pid) != process.pid else 1
    before, start = main_stacks(), len(log.read_text(errors="replace"))
    process.send_signal(signal.SIGUSR1)
    wait_for(lambda: main_stacks() >= before + processes, timeout_s)
    text = log.read_text(errors="replace")
    return text[max(0, min(start, len(text) - 8000)) :]


def stop(process: subprocess.Popen[Any], timeout_s: float = 30, log: Path | None = None) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it is still there after ``timeout_s``
    (having asked it for its stacks first if its ``log`` is given, shown in the failure)."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if log is None:
            raise
        stacks = stacks_in_log(process, log)
        raise AssertionError(
            f"pid {process.pid} still ran {timeout_s:g} s after SIGTERM; its log ends:\n{stacks}"
        ) from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
