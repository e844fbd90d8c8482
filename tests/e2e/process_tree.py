"""A ``kmq`` command run for a test, with every process it starts stopped by PID however the
test ends (an assertion, a wait that ran out, pytest-timeout's exception).

The command runs in its own session; the PIDs of its descendants are noted ten times a second
with their start times, because some of them (Dagster's webserver and daemon, the console,
the broker) start sessions of their own, so that killing the command's process group misses
them, and once the command is gone they are orphans nobody can find from it. A PID is only
signalled while it still names the process that was noted (same start time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kmq_dagster.child_processes import descendants
from tests.processes import kmq_argv

#: Seconds between two looks at the command's descendants.
SAMPLE_INTERVAL_S = 0.1


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot), ``None`` if it is gone or a zombie: with
    its PID it names one process, never another that got the PID later."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:200].replace(b"\0", b" ").decode()
    return "?"


@dataclass
class KmqRun:
    process: subprocess.Popen[bytes]
    log: Path
    #: Every descendant seen while the command ran: PID -> start time.
    seen: dict[int, int] = field(default_factory=dict)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def note_descendants(self) -> None:
        for pid in descendants(self.process.pid):
            started = start_time(pid)
            if started is not None:
                self.seen.setdefault(pid, started)

    def still_running(self) -> dict[int, str]:
        """The noted descendants that still run, with their command lines."""
        return {
            pid: command_line(pid)
            for pid, started in list(self.seen.items())
            if start_time(pid) == started
        }

    def kill_everything(self) -> None:
        """SIGKILL the command and every descendant noted, by PID."""
        if self.process.poll() is None:
            self.note_descendants()
            self.process.kill()
        for pid in self.still_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)


@contextlib.contextmanager
def running_kmq(
    *args: str, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Iterator[KmqRun]:
    """``kmq ARGS`` with its output (stdout and stderr) in ``log``; on the way out, whatever
    ended the test, the command and every descendant noted are killed."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            kmq_argv(*args), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    run = KmqRun(process, log)
    leaving = threading.Event()

    def sample() -> None:
        while not leaving.is_set() and process.poll() is None:
            run.note_descendants()
            time.sleep(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample, name="descendants", daemon=True)
    sampler.start()
    try:
        yield run
    finally:
        leaving.set()
        sampler.join(10)
        run.kill_everything()
