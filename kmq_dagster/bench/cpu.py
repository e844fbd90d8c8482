"""CPU time of a benchmark's whole process tree, by kind of process.

On a machine of few cores, a path's throughput is bounded by the CPU it needs from every
process, not only its own: the embedded broker serving fetches, Spark's JVM and its Python
workers all share the cores. ``kmq bench spark`` reports the CPU seconds each path used this
way, so a ratio between two paths can be traced to who did the extra work.

Read from ``/proc`` (Linux): this process and every descendant (the embedded broker, Spark's
JVM and the Python workers it forks). An external broker's CPU is not seen.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

_PROC = Path("/proc")
#: Fields of /proc/<pid>/stat after the command name: state is field 0, ppid 1, and utime,
#: stime, cutime, cstime (in clock ticks) 11 to 14. cutime and cstime hold the CPU of reaped
#: children, so a worker that exited between two readings still counts once.
_PPID, _FIRST_TIME, _LAST_TIME = 1, 11, 15


def available() -> bool:
    """Whether process CPU times can be read here."""
    return (_PROC / "self" / "stat").exists()


def tree_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by this process and its descendants, by kind: ``broker``
    (the embedded Kafka-compatible broker), ``jvm`` (Spark's) and ``python`` (this process
    and Spark's Python workers)."""
    processes = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    used: defaultdict[str, float] = defaultdict(float)
    pending = [os.getpid()]
    ticks = os.sysconf("SC_CLK_TCK")
    while pending:
        pid = pending.pop()
        if pid in processes:
            used[_kind(pid)] += processes[pid][1] / ticks
        pending.extend(children.get(pid, ()))
    return dict(used)


def used_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds by kind since ``before`` (a :func:`tree_cpu_s` reading)."""
    now = tree_cpu_s()
    return {kind: now[kind] - before.get(kind, 0.0) for kind in sorted(now)}


def _pids() -> list[int]:
    return [int(entry.name) for entry in _PROC.iterdir() if entry.name.isdigit()]


def _stat(pid: int) -> tuple[int, int] | None:
    """The parent and the CPU ticks (own plus reaped children's) of ``pid``."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # ended meanwhile
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[_PPID]), sum(map(int, fields[_FIRST_TIME:_LAST_TIME]))


def _kind(pid: int) -> str:
    try:
        command = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "python"
    program = os.path.basename(command[0].decode(errors="replace")) if command else ""
    if program.startswith("tansu") or program == "weed":  # weed: its durable storage
        return "broker"
    if program == "java":
        return "jvm"
    return "python"
