"""A long-running command run in a child process, so that a crash of the Kafka client inside
it still ends in one error line and a documented exit code.

Why: librdkafka 2.16 dereferences a NULL topic name (``rd_kafka_metadata_update_op`` ->
``rd_kafka_metadata_cache_find`` -> ``strcmp``) when a Fetch response names a partition by a
zero topic id and carries a new leader for it. The embedded broker answers exactly so for a
topic deleted while a consumer fetches it, and a consumer fetches every 50 ms: a tracker whose
markers topic is deleted dies of SIGSEGV in the client's own thread before any check of
kmq's can run. No Python code survives that in the process, so ``kmq tracker`` runs the
tracker in a child and, if the child dies of a signal, explains why from the cluster's state.

The child is in its own process group (Ctrl-C reaches the parent, which passes it on once),
dies with the parent (``PR_SET_PDEATHSIG``: a SIGKILLed ``kmq tracker`` leaves no tracker
behind), and inherits stdout and stderr. Its exit code is passed on; a death by signal N is
``128 + N``, like a shell's. Linux only: elsewhere the command runs in the process itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import FrameType

#: Set in the child's environment: the child runs the command itself.
CHILD_ENV = "KMQ_CRASH_GUARD_CHILD"
#: Signals that mean the child crashed (not that someone stopped it).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL})
#: Signals the parent passes on to the child.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def guard_available(argv: Sequence[str] | None) -> bool:
    """Whether to run the command in a guarded child: the real ``kmq`` process on Linux
    (``argv`` ``None``), not a child already, not a call of ``main([...])`` from Python."""
    return argv is None and sys.platform == "linux" and os.environ.get(CHILD_ENV) != "1"


def run_guarded(
    args: Sequence[str], explain_crash: Callable[[signal.Signals], tuple[str, int]]
) -> int:
    """Run ``kmq args`` in a child process and return its exit code.

    Args:
        args: the command line after ``kmq``.
        explain_crash: given the signal that crashed the child, the error line to print
            (without ``kmq: error:``) and the exit code to end with.
    """
    parent_pid = os.getpid()

    def die_with_parent() -> None:  # in the child, before it runs
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    child = subprocess.Popen(
        [sys.executable, "-m", "kmq_dagster.cli", *args],
        env={**os.environ, CHILD_ENV: "1"},
        process_group=0,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - the parent has no threads yet
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code >= 0:
        return code
    killed_by = signal.Signals(-code)
    if killed_by not in CRASH_SIGNALS:
        return 128 + killed_by
    line, exit_code = explain_crash(killed_by)
    print(f"kmq: error: {line}", file=sys.stderr, flush=True)
    return exit_code
