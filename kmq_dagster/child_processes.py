"""Child services in process groups of their own: started with their output in a log file,
stopped (with everything they started) by SIGTERM to the group, then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self


def spawn_in_group(
    argv: list[str], *, log_file: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, its output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        return subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_groups(processes: Iterable[subprocess.Popen[bytes]], timeout_s: float = 30) -> None:
    """SIGTERM each process's group, wait up to ``timeout_s`` in all, SIGKILL what is left."""
    processes = list(processes)
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


class GroupService:
    """A service made of child process groups, used as a context manager: whatever
    :meth:`start` spawned is stopped however the start or the ``with`` body ends (a start that
    fails half-way must not leave a webserver or a daemon behind)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, timeout_s: float = 30) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
