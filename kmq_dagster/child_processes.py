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


class Lifeline:
    """The processes this one runs under (its parent, their parent, ... up to, not including,
    PID 1), as they were when it started: :meth:`lost` names the first one gone since.

    A Dagster run's process (and its step processes) outlives whatever launched it: killing
    ``dagster dev`` or ``dg dev`` leaves the run going, and its code server waits for it. A
    service that runs until terminated (the tracker) asks its lifeline instead, and stops. A
    process is told from a later one with its number by its start time (Linux ``/proc``);
    elsewhere only the parent is watched (:func:`os.getppid` changes when it dies). Under a
    launcher that starts runs as a container's first process there is nothing above: it never
    reports a loss.
    """

    def __init__(self) -> None:
        self._chain: list[tuple[int, str, str]] = []  # (pid, start time, name)
        pid = os.getppid()
        while pid > 1:
            stat = _proc_stat(pid)
            if stat is None:
                if not self._chain:  # no /proc: watch the parent only
                    self._chain.append((pid, "", "the parent process"))
                break
            name, ppid, started = stat
            self._chain.append((pid, started, name))
            pid = ppid

    @property
    def pids(self) -> list[int]:
        """The watched processes, nearest first."""
        return [pid for pid, _, _ in self._chain]

    def lost(self) -> str | None:
        """``"<name> (pid N)"`` of the nearest watched process that is gone; ``None``: all live."""
        for pid, started, name in self._chain:
            if not started:
                gone = os.getppid() != pid
            else:
                stat = _proc_stat(pid)
                gone = stat is None or stat[2] != started
            if gone:
                return f"{name} (pid {pid})"
        return None


#: Fields of :func:`stat_fields`: state 0, parent 1, start time 19 (clock ticks after boot).
STAT_STATE, STAT_PPID, STAT_START = 0, 1, 19


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and
    parentheses: the fields after its last ``)`` are fixed); ``None`` if the process is gone
    or there is no ``/proc``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 1 :].split()


def is_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a zombie has closed its files and sockets)."""
    fields = stat_fields(pid)
    return fields is not None and fields[STAT_STATE] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (children, theirs, ...), read from ``/proc``; empty
    where there is none."""
    by_parent: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None:
            by_parent.setdefault(int(fields[STAT_PPID]), []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in by_parent.get(pending.pop(), ()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _proc_stat(pid: int) -> tuple[str, int, str] | None:
    """``(name, parent pid, start time)`` of a live process from ``/proc``; ``None`` if it is
    gone, a zombie, or there is no ``/proc``."""
    fields = stat_fields(pid)
    if fields is None or fields[STAT_STATE] in ("Z", "X"):
        return None
    try:
        text = Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    except OSError:
        return None
    return text, int(fields[STAT_PPID]), fields[STAT_START]
