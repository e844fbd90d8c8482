"""Ends a test process that froze with the GIL held, with every thread's stack, instead of
letting it hang the run.

pytest-timeout cannot end such a freeze: its signal handler, and its timer thread, are Python
code, and Python code runs only with the GIL. A C call that blocks while holding the GIL
freezes every Python thread at once (seen in CI: librdkafka waiting forever inside a
``Consumer.close()`` that held the GIL, kafka/group_exit.py); the run then waits for CI's
90-minute limit. ``faulthandler``'s watchdog is a C thread that needs no GIL: when a test,
with its setup and teardown, runs past its pytest-timeout limit plus a margin, it writes each
thread's stack to stderr and exits the process. Under xdist the controller then reports the
worker as crashed, names the test, and goes on with a new worker.

conftest.py re-exports the hooks; ``-p tests.freeze_watchdog`` loads them alone.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from typing import IO

import pytest
from pytest_timeout import get_env_settings  # type: ignore[import-untyped]

#: Seconds past a test's pytest-timeout limit before the watchdog ends a frozen process.
DEFAULT_FREEZE_MARGIN_S = 60.0
STDERR_FD = 2
#: A test's limit when pytest-timeout sets none (timeout 0: no limit of its own).
NO_TIMEOUT_LIMIT_S = 1800.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "freeze_margin_s",
        "seconds past a test's timeout before a frozen test process is ended with its stacks",
        default=str(DEFAULT_FREEZE_MARGIN_S),
    )


#: Where the stacks go: a copy of the process's stderr made before any test runs, since
#: pytest's capture points stderr at a file during each test.
_STACKS_OUT = pytest.StashKey[IO[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STACKS_OUT] = os.fdopen(os.dup(STDERR_FD), "w")


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_STACKS_OUT].close()


def freeze_limit_s(item: pytest.Item) -> float:
    """Seconds the whole test (setup, call, teardown) may take before it counts as frozen: its
    pytest-timeout limit, found where pytest-timeout finds it (the test's ``timeout`` marker,
    else ``--timeout``, ``PYTEST_TIMEOUT`` or the ini file), plus the margin."""
    marker = item.get_closest_marker("timeout")
    timeout_s: float | None = None
    if marker is not None:
        given = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        timeout_s = None if given is None else float(given)
    if timeout_s is None:
        timeout_s = get_env_settings(item.config).timeout
    if not timeout_s or timeout_s <= 0:
        timeout_s = NO_TIMEOUT_LIMIT_S
    return timeout_s + float(item.config.getini("freeze_margin_s"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    stacks_out = item.config.stash[_STACKS_OUT]
    faulthandler.dump_traceback_later(freeze_limit_s(item), exit=True, file=stacks_out)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
