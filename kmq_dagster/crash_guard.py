"""``python -m kmq_dagster.crash_guard ARGS``: run ``kmq ARGS`` in a child process, so that a
crash of the Kafka client inside it still ends in one error line and a documented exit code.

Why: librdkafka 2.16 dereferences a NULL topic name (``rd_kafka_metadata_update_op`` ->
``rd_kafka_metadata_cache_find`` -> ``strcmp``) when a Fetch response names a partition by a
zero topic id and carries a new leader for it. The embedded broker answers exactly so for a
topic deleted while a consumer fetches it, and a consumer fetches every 50 ms: a tracker whose
markers topic is deleted dies of SIGSEGV in the client's own thread before any check of kmq's
can run. No Python code survives that in the process. A worker dies the same way when a
retry topic it fetches is deleted, at any concurrency.

So ``kmq tracker`` and ``kmq worker`` replace themselves (``exec``: same PID) with this small
supervisor, which imports next to nothing (about 20 MB), runs the command in a child, and passes
its exit code on. If the child crashes, the supervisor replaces itself with the command once
more in *explain* mode (:data:`EXPLAIN_ENV` names the signal), which prints the one error line
the cluster's state explains and exits with its code (see ``kmq_dagster.cli.crash_guard``).

The child is in its own process group (Ctrl-C reaches the supervisor, which passes it on once),
dies with the supervisor (``PR_SET_PDEATHSIG``: a SIGKILLed ``kmq tracker`` leaves no tracker
behind), and inherits stdin, stdout and stderr. A death by another signal N is ``128 + N``,
like a shell's.

The supervisor is also the stop's last resort. A handler call stuck in C code that holds
Python's GIL (a runaway regular expression, ``sum`` over a huge range) runs no Python at all
in its process: not the signal handler that asks the worker to stop, not the thread that ends
it at its ``--drain-timeout``. So the first SIGTERM or Ctrl-C passed on also starts a deadline
(:data:`STOP_DEADLINE_ENV` seconds: the command's own deadline plus :data:`STOP_GRACE_S`); a
child still running then is killed, with one line saying so, and the supervisor exits as the
child's own deadline would have (0 after SIGTERM, 130 after Ctrl-C). What the child had not
acknowledged is redelivered after its visibility timeout, as after any crash.

A child that dies of the stop signal passed on got it before setting up its own stop (while it
imported its handler or opened its queue): it started nothing, and the supervisor exits as a
clean stop does (0 after SIGTERM, 130 after Ctrl-C) rather than ``128 + N``.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from kmq_dagster.broker.process import die_with_parent

#: Set in the child's environment: the child runs the command itself.
CHILD_ENV = "KMQ_CRASH_GUARD_CHILD"
#: Set (to the signal's number) when the command runs again to explain a crash.
EXPLAIN_ENV = "KMQ_CRASH_GUARD_EXPLAIN"
#: Signals that mean the child crashed (not that someone stopped it).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL})
#: Signals the supervisor passes on to the child (SIGUSR1: the child writes its stacks).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
#: Signals that ask the command to stop; the first starts the stop deadline.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
#: Set for the supervisor: seconds from the first stop signal to killing a child still running.
STOP_DEADLINE_ENV = "KMQ_CRASH_GUARD_STOP_DEADLINE_S"
#: What a child gets beyond its own deadline (``kmq worker``'s ``--drain-timeout``) to write its
#: acknowledgements, leave its group and exit; ``KMQ_CRASH_GUARD_STOP_GRACE_S`` overrides it.
STOP_GRACE_S = 30.0


def supervise(args: Sequence[str]) -> int:
    """Run ``kmq args`` in a child; its exit code (``128 + N`` after signal N), or, after a
    crash, whatever the command in explain mode ends with (this process is replaced)."""
    kmq = [sys.executable, "-m", "kmq_dagster.cli", *args]
    deadline_s = float(os.environ.pop(STOP_DEADLINE_ENV, STOP_GRACE_S))
    #: The first stop signal passed on, and whether the deadline then killed the child.
    stopped_by: list[int] = []
    killed: list[bool] = []
    #: Signals that came before the child existed: passed on as soon as it does.
    early: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            early.append(signum)
            return
        if child.poll() is None:
            child.send_signal(signum)
            if signum in STOP_SIGNALS and not stopped_by:
                stopped_by.append(signum)
                # (a zero timer would be none at all: a deadline of 0 s kills at once)
                signal.setitimer(signal.ITIMER_REAL, max(deadline_s, 0.001))

    def kill_at_deadline(_signum: int, _frame: FrameType | None) -> None:
        if child is not None and child.poll() is None:
            sys.stderr.write(
                f"kmq: still running {deadline_s:g} s after the stop request: killed (a handler "
                "call in C code that holds Python's GIL keeps a process from stopping itself); "
                "what it had not acknowledged is redelivered after its visibility timeout\n"
            )
            sys.stderr.flush()
            killed.append(True)
            child.kill()

    # In place before the child starts: a stop signal in between must not kill this process
    # and leave the child to die of its parent's death instead.
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.signal(signal.SIGALRM, kill_at_deadline)
    # kill -USR1: this process's stack first, then the child's (forwarded by the chain)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
    child = subprocess.Popen(
        kmq,
        env={**os.environ, CHILD_ENV: "1"},
        process_group=0,
        # Safe: this process has no threads, and the child only calls prctl before exec.
        preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509
    )
    for early_signal in early:
        forward(early_signal, None)
    code = child.wait()
    signal.setitimer(signal.ITIMER_REAL, 0)
    if killed:  # as the child's own stop deadline exits
        return _stop_exit_code(stopped_by[0])
    if stopped_by and code == -stopped_by[0]:
        # It died of the stop signal passed on: it came before the command had set up its
        # own stop (while it imported its handler or opened its queue), so it had started no
        # call. Stopped as asked, with the code a clean stop exits with.
        sys.stderr.write("kmq: stopped while starting\n")
        sys.stderr.flush()
        return _stop_exit_code(stopped_by[0])
    if code >= 0:
        return code
    if signal.Signals(-code) not in CRASH_SIGNALS:
        return 128 - code
    sys.stdout.flush()
    os.execve(sys.executable, kmq, {**os.environ, CHILD_ENV: "1", EXPLAIN_ENV: str(-code)})
    return 128 - code  # not reached: execve does not return


def _stop_exit_code(stop_signal: int) -> int:
    """What a command stopped by ``stop_signal`` exits with: 130 after Ctrl-C, 0 after SIGTERM."""
    return 128 + signal.SIGINT if stop_signal == signal.SIGINT else 0


def supervised_pid(pid: int) -> int:
    """The PID of the command ``pid`` runs if ``pid`` is a supervisor, else ``pid``: what to
    measure (memory, CPU) when one means the tracker or worker itself (Linux ``/proc``)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return pid
    if __name__.encode() in cmdline and len(children) == 1:
        return int(children[0])
    return pid


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
