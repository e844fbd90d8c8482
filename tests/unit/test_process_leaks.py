"""The suite's own check that nothing a test starts outlives it (``tests/process_leaks.py``),
shown on a throwaway test file run by a real pytest, with and without xdist workers."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kmq_dagster.child_processes import is_running

pytestmark = pytest.mark.slow  # each runs a pytest (with xdist workers) that waits out graces

REPO_ROOT = Path(__file__).resolve().parents[2]

HELPERS = """
import signal, subprocess, sys
from pathlib import Path

import pytest

PIDS = Path(__file__).with_name("pids")


def note(name, pid):
    with PIDS.open("a") as pids:
        pids.write(f"{name} {pid}\\n")


def sleeper(seconds, **options):
    # Returned once the child runs sleep: until its exec, /proc shows the environment its
    # parent was started with, without the tag of the test or fixture that started it (on a
    # loaded machine a module fixture's teardown check once came first).
    process = subprocess.Popen(["sleep", str(seconds)], **options)
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    while process.poll() is None and not cmdline.read_bytes().startswith(b"sleep"):
        pass
    return process
"""

MODULE_FIXTURE_TESTS = """
from conftest import note, sleeper
import pytest


@pytest.fixture(scope="module")
def leaky_module_server():
    server = sleeper(601, start_new_session=True)
    note("module-fixture", server.pid)
    yield server  # never stopped


def test_uses_a_module_fixture(leaky_module_server):
    assert leaky_module_server.poll() is None
"""

THROWAWAY_TESTS = """
import signal, subprocess, sys, time

import pytest

from conftest import note, sleeper


@pytest.fixture(scope="session")
def shared_server():
    server = sleeper(600, start_new_session=True)
    note("session-fixture", server.pid)
    yield server
    server.terminate()
    server.wait()


def test_detached_and_left(shared_server):
    note("detached", sleeper(602, start_new_session=True).pid)


def test_double_forked_daemon(shared_server):
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 603 >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True)
    pid = int(out.stdout)
    note("daemon", pid)
    # The test ends once its daemon runs: a process caught between fork and exec at the check
    # is found by the next one, which would report it at another test (a loaded machine).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sleep"):
                break
        except OSError:
            pass
        time.sleep(0.05)


def test_own_environment(shared_server):
    note("own-env", sleeper(604, env={}).pid)


def test_stops_what_it_starts(shared_server):
    child = sleeper(605)
    child.terminate()
    child.wait()


def test_takes_a_moment_to_exit_after_sigterm(shared_server):
    slow = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time\\n"
         "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\\n"
         "print('ready', flush=True)\\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    assert slow.stdout.readline() == "ready\\n"
    slow.send_signal(signal.SIGTERM)  # and no wait


def test_uses_multiprocessing(shared_server):
    import multiprocessing
    from multiprocessing import resource_tracker

    multiprocessing.get_context("spawn").Lock()  # starts the resource tracker, kept for later
    note("resource-tracker", resource_tracker._resource_tracker._pid)


def test_server_still_up(shared_server):
    assert shared_server.poll() is None
"""


def run_throwaway(
    tmp_path: Path, files: dict[str, str], *options: str
) -> tuple[dict[str, str], dict[str, int], subprocess.CompletedProcess[str]]:
    """Run the throwaway test ``files``; return each test's outcome (with its error text), the
    pids they noted, and the finished pytest."""
    (tmp_path / "conftest.py").write_text(HELPERS)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nprocess_leak_grace_s = 3\n")
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.process_leaks", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-o", "timeout=120", *options],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert report.exists(), done.stdout + done.stderr
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [f"{child.tag}: {child.get('message')}" for child in case]
        outcomes[case.get("name", "")] = "; ".join(problems) or "passed"
    noted = (tmp_path / "pids").read_text().split()
    pids = {name: int(pid) for name, pid in zip(noted[::2], noted[1::2], strict=True)}
    return outcomes, pids, done


#: The throwaway tests that leave a process running, with what they noted and its command.
LEAVING = {
    "test_detached_and_left": ("detached", "sleep 602"),
    "test_double_forked_daemon": ("daemon", "sleep 603"),
    "test_own_environment": ("own-env", "sleep 604"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_process_a_test_leaves_running_fails_it_and_is_killed(
    tmp_path: Path, workers: str
) -> None:
    files = {"test_module_fixture.py": MODULE_FIXTURE_TESTS, "test_throwaway.py": THROWAWAY_TESTS}
    outcomes, pids, done = run_throwaway(tmp_path, files, "-n", workers)
    output = done.stdout + done.stderr

    for name, (key, command) in LEAVING.items():
        assert "processes left running, killed" in outcomes[name], output
        assert f"pid {pids[key]} (started by test test_throwaway.py::{name}" in outcomes[name]
        assert command in outcomes[name]
        assert not is_running(pids[key])
    # A session fixture's server is no leak while the session runs; it was stopped at the end.
    for name in ["test_stops_what_it_starts", "test_takes_a_moment_to_exit_after_sigterm",
                 "test_uses_multiprocessing", "test_server_still_up"]:  # fmt: skip
        assert outcomes[name] == "passed", output
    assert not is_running(pids["session-fixture"])
    # A module fixture that never stops its server is named when its module ends.
    module_leak = outcomes["test_uses_a_module_fixture"]
    assert "started by fixture 'leaky_module_server' (module scope)): sleep 601" in module_leak
    assert not is_running(pids["module-fixture"])


WORKER_CRASH_TESTS = """
import os, signal

from conftest import note, sleeper


def test_worker_dies():
    note("orphan", sleeper(606, start_new_session=True).pid)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(300)
def test_what_a_crashed_worker_left_is_killed_at_the_end(tmp_path: Path) -> None:
    files = {"test_crash.py": WORKER_CRASH_TESTS}
    _, pids, done = run_throwaway(tmp_path, files, "-n", "1")

    assert done.returncode != 0
    assert "processes left running after the tests (killed)" in done.stdout, done.stdout
    assert f"pid {pids['orphan']} (" in done.stdout
    assert "of a lost worker): sleep 606" in done.stdout
    assert not is_running(pids["orphan"])
