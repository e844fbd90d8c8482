"""The suite's freeze watchdog (tests/freeze_watchdog.py) ends a test process frozen with the
GIL held, which pytest-timeout cannot do, and shows where it froze."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: A test that blocks in C while holding the GIL, as librdkafka's close did: ctypes.PyDLL
#: keeps the GIL during the call, and a second lock of a plain mutex waits forever, signals
#: or not.
FROZEN_TEST = """
import ctypes

def test_freezes_holding_the_gil():
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
"""


def run_frozen_test(
    tmp_path: Path, *options: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "test_frozen.py").write_text(FROZEN_TEST)
    # The test's own limit is 1 s (pytest-timeout), the watchdog's margin 2 s past it.
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\nfreeze_margin_s = 2\n")
    started = time.monotonic()
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:randomly", "-p", "tests.freeze_watchdog", *options, "test_frozen.py"],
        cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return finished, time.monotonic() - started


def test_a_test_frozen_with_the_gil_held_is_ended_with_its_stack(tmp_path: Path) -> None:
    # given a test that freezes every Python thread, pytest-timeout's limit included
    # when it runs under the watchdog
    finished, took_s = run_frozen_test(tmp_path)
    # then the process ends soon after the test's limit, failing, with the frozen line shown
    assert finished.returncode != 0
    assert took_s < 50
    assert "Timeout" in finished.stderr
    assert "test_freezes_holding_the_gil" in finished.stderr


def test_a_longer_timeout_on_the_command_line_is_the_watchdogs_limit_too(tmp_path: Path) -> None:
    # given the ini file's 1 s, and --timeout 8 on the command line, as pytest-timeout takes it
    # when the test freezes
    finished, took_s = run_frozen_test(tmp_path, "--timeout", "8")
    # then the watchdog waits out the 8 s and its margin, not the ini file's 1 s
    assert finished.returncode != 0
    assert "Timeout (0:00:10)!" in finished.stderr
    assert took_s >= 10
