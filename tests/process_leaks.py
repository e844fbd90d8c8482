"""Nothing a test starts may outlive it: a pytest plugin (loaded by ``tests/conftest.py``).

Every process started while a test or a fixture runs inherits ``KMQ_TEST_PROCESS``, a tag that
names the run, the xdist worker and what was running (this test, or that session-, module- or
class-scoped fixture); double-forked daemons, Spark JVMs, Dagster run workers and Streamlit
carry it too, whatever their parent is now. After each test's teardown the worker reads
``/proc/*/environ`` (a few milliseconds) for its own tags. A survivor started by a test, or by a
fixture already torn down, gets a short grace to finish exiting, then is SIGKILLed (its process
group too, when that group is its own) and the test errors with the survivor's command line.
Processes of fixtures still set up are left alone until their fixture is torn down; after the
session's last teardown nothing of the worker may remain. A direct child started with an
environment of its own (``env={}``) carries no tag; it is caught as a child of the worker.

PySpark keeps one gateway JVM per Python process for every later session (``getOrCreate``),
multiprocessing one resource tracker: they and their children are left alone between tests and
shut down before the session's last check.

Limits: a process that replaced its environment area (PostgreSQL's and Chromium's helpers
rewrite it for their titles) is still found while it descends from a tagged process; once
orphaned it is not. The xdist controller kills and reports what a crashed worker left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from kmq_dagster.child_processes import is_running

ENV_VAR = "KMQ_TEST_PROCESS"
_RUN_KEY = "kmq_test_run"
_FINDINGS_KEY = "kmq_processes_left"
#: How long a survivor may take to finish exiting (a JVM after SIGTERM on a loaded machine).
DEFAULT_GRACE_S = 10.0


@dataclass
class Proc:
    pid: int
    ppid: int
    pgid: int
    tag: str | None  # this run's token in its KMQ_TEST_PROCESS, if any


def snapshot(prefix: str) -> dict[int, Proc]:
    """Every live (not zombie) process, with the token starting with ``prefix`` it carries."""
    table: dict[int, Proc] = {}
    needle = f"{ENV_VAR}=".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                # The command name may contain spaces; the fields after its ')' are fixed.
                fields = stat_file.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as environ_file:
                environ = environ_file.read()
        except (OSError, IndexError):
            continue  # ended meanwhile
        tag = None
        start = environ.find(needle)
        if start >= 0:
            value = environ[start + len(needle) :].split(b"\0", 1)[0].decode(errors="replace")
            tag = next((token for token in value.split() if token.startswith(prefix)), None)
        table[int(entry.name)] = Proc(int(entry.name), int(fields[1]), int(fields[2]), tag)
    return table


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            words = cmdline_file.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(word.decode(errors="replace") for word in words)
    return text if len(text) <= 300 else text[:297] + "..."


def descendants_of(roots: Iterable[int], table: dict[int, Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    frontier = list(roots)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def pyspark_gateway_pid() -> int | None:
    """The PySpark gateway JVM this process launched, while it runs."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return proc.pid if proc is not None and proc.poll() is None else None


def stop_pyspark_gateway(timeout_s: float = 30) -> None:
    """End the gateway JVM once no Spark session is left: it exits when its stdin closes."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    SparkContext._gateway = None
    SparkContext._jvm = None


def kept_helpers() -> set[int]:
    """Helpers a library keeps for the life of this process and reuses for every later call:
    PySpark's gateway JVM and multiprocessing's resource tracker."""
    helpers = {pyspark_gateway_pid()}
    if "multiprocessing.resource_tracker" in sys.modules:
        from multiprocessing import resource_tracker

        helpers.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    return {pid for pid in helpers if pid is not None and is_running(pid)}


def stop_kept_helpers() -> None:
    if pyspark_gateway_pid() is not None:
        stop_pyspark_gateway()
    if "multiprocessing.resource_tracker" in sys.modules:
        from multiprocessing import resource_tracker

        stop = getattr(resource_tracker._resource_tracker, "_stop", None)
        if stop is not None:
            stop()  # closes its pipe: it exits


def end_all(
    procs: dict[int, str], table: dict[int, Proc], keep: set[int], grace_s: float
) -> list[str]:
    """Wait up to ``grace_s`` for ``procs`` (pid: who started it) to exit; SIGKILL the rest
    and their own process groups (never a group with a process of ``keep``); describe them."""
    deadline = time.monotonic() + grace_s
    while any(is_running(pid) for pid in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = {pid: owner for pid, owner in procs.items() if is_running(pid)}
    kept_groups = {table[pid].pgid for pid in keep if pid in table}
    lines = []
    for pid, owner in sorted(survivors.items()):
        lines.append(f"pid {pid} (started by {owner}): {command_line(pid)}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        pgid = table[pid].pgid if pid in table else 0
        if pgid > 1 and pgid not in kept_groups and (pgid in survivors or not is_running(pgid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in survivors) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


@dataclass
class Owner:
    """What ran when a tagged process started."""

    what: str
    #: Its processes may stay (a fixture still set up, the collection); never for a test.
    lives: bool


class ProcessLeakCheck:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        self.is_controller = workerinput is None and getattr(config.option, "dist", "no") != "no"
        self.run = (workerinput or {}).get(_RUN_KEY) or uuid.uuid4().hex[:12]
        self.prefix = f"{self.run}/{(workerinput or {}).get('workerid', 'main')}/"
        self.grace_s = float(config.getini("process_leak_grace_s"))
        self.outer = os.environ.get(ENV_VAR, "").split()  # tokens of enclosing runs (kept)
        self.owners: dict[str, Owner] = {}
        self.fixture_tokens: dict[int, str] = {}
        self.untagged: dict[int, str] = {}  # untagged children of this process: their owner
        self.findings: list[str] = []  # found after the last test: shown in the summary
        self.current = ""
        if not self.is_controller:
            self.outside = self._enter(Owner("collection or a plugin", lives=True))

    def _enter(self, owner: Owner) -> str:
        token = f"{self.prefix}{len(self.owners)}"
        self.owners[token] = owner
        self._set(token)
        return token

    def _set(self, token: str) -> None:
        self.current = token
        os.environ[ENV_VAR] = " ".join([*self.outer, token])

    def _untagged_children(self, table: dict[int, Proc]) -> set[int]:
        me = os.getpid()
        return {proc.pid for proc in table.values() if proc.ppid == me and proc.tag is None}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        if self.is_controller or fixturedef.scope == "function":
            return (yield)
        before = self._untagged_children(snapshot(self.prefix))
        previous = self.current
        token = self._enter(
            Owner(f"fixture '{fixturedef.argname}' ({fixturedef.scope} scope)", lives=True)
        )
        self.fixture_tokens[id(fixturedef)] = token
        try:
            return (yield)
        finally:
            for pid in self._untagged_children(snapshot(self.prefix)) - before:
                self.untagged[pid] = token
            self._set(previous)

    def pytest_fixture_post_finalizer(self, fixturedef: Any) -> None:
        token = self.fixture_tokens.pop(id(fixturedef), None)
        if token is not None:
            self.owners[token].lives = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        if self.is_controller:
            return (yield)
        self._enter(Owner(f"test {item.nodeid}", lives=False))
        try:
            return (yield)
        finally:
            self._set(self.outside)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        try:
            result = yield
        except BaseException:
            lines = self.check(final=nextitem is None)
            if lines:
                item.add_report_section("teardown", "processes left running", "\n".join(lines))
            raise
        lines = self.check(final=nextitem is None)
        if lines:
            pytest.fail("processes left running, killed:\n  " + "\n  ".join(lines), pytrace=False)
        return result

    def check(self, *, final: bool) -> list[str]:
        """Kill and describe the survivors: of tests and torn-down fixtures; of everything
        this process started if ``final``."""
        if final:
            stop_kept_helpers()
        table = snapshot(self.prefix)
        kept = self._me_and_ancestors(table)
        helpers = set() if final else kept_helpers()
        kept |= helpers | descendants_of(helpers, table)
        left: dict[int, str] = {}
        for proc in table.values():
            if proc.pid in kept:
                continue
            if proc.tag is not None:
                # Unknown to the controller: a worker that ended before its own checks.
                owner = self.owners.get(proc.tag, Owner(f"{proc.tag}, of a lost worker", False))
            elif proc.ppid == os.getpid() and not self.is_controller:  # its children: workers
                owner = self.owners.get(
                    self.untagged.get(proc.pid, self.current), Owner("?", lives=False)
                )
                owner = Owner(f"{owner.what}, with an environment of its own", owner.lives)
            else:
                continue
            if owner.lives and not final:
                kept.add(proc.pid)
            else:
                left[proc.pid] = owner.what
        for pid in list(left):
            for descendant in descendants_of([pid], table) - kept:
                left.setdefault(descendant, f"{left[pid]}, a descendant of pid {pid}")
        for pid in list(self.untagged):
            if not is_running(pid):
                del self.untagged[pid]
        return end_all(left, table, kept, self.grace_s)

    @staticmethod
    def _me_and_ancestors(table: dict[int, Proc]) -> set[int]:
        found = set()
        pid = os.getpid()
        while pid > 0 and pid not in found:
            found.add(pid)
            pid = table[pid].ppid if pid in table else 0
        return found

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist's controller hands its run id to each worker it starts."""
        node.workerinput[_RUN_KEY] = self.run

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any) -> None:
        self.findings += getattr(node, "workeroutput", {}).get(_FINDINGS_KEY, [])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After the last teardown (also of an interrupted session); the xdist controller
        checks last, after its workers ended, for what a crashed worker left."""
        if self.is_controller:
            self.prefix = f"{self.run}/"  # every worker's
            self.owners.clear()
        self.findings += self.check(final=True)
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[_FINDINGS_KEY] = self.findings
        elif self.findings and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.findings:
            terminalreporter.section("processes left running after the tests (killed)", red=True)
            for line in self.findings:
                terminalreporter.line(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "process_leak_grace_s",
        "seconds a process started by a test may take to exit after the test",
        default=str(DEFAULT_GRACE_S),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ProcessLeakCheck(config), "kmq-process-leaks")
