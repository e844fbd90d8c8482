"""Stopping ``kmq demo`` at any phase: nothing new starts, and every process it started ends.

Spark's JVM (and the Python workers it forks) is started by PySpark, which keeps no handle a
caller may stop it by: a Ctrl-C while it started left it running, and once started PySpark
takes Ctrl-C for itself (its handler cancels the jobs and raises ``KeyboardInterrupt``).
:func:`stoppable_spark` notes this process's children before Spark starts (:func:`child_tree`)
and, when the block ends or a stop is asked for while Spark starts, ends every process started
since (:func:`end_processes`): SIGTERM, then SIGKILL for what is still there after a grace
period. Processes are told apart by PID and start time, so a PID the kernel reused for another
process is never signalled. Reads ``/proc`` (Linux); elsewhere nothing is found and nothing is
ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from kmq_dagster.child_processes import STAT_START, STAT_STATE, descendants, stat_fields
from kmq_dagster.errors import KmqError
from kmq_dagster.spark.session import local_session

#: Seconds between two looks at whether the signalled processes are gone.
_POLL_S = 0.1

#: Seconds between two looks at the stop request while Spark starts or runs.
STOP_POLL_S = 0.2

#: A process as the kernel knows it: PID and start time (clock ticks after boot).
Process = tuple[int, int]


def child_tree(pid: int | None = None) -> set[Process]:
    """Every live descendant of ``pid`` (default: this process), with its start time."""
    tree: set[Process] = set()
    for child in descendants(os.getpid() if pid is None else pid):
        fields = stat_fields(child)
        if fields is not None and fields[STAT_STATE] != "Z":
            tree.add((child, int(fields[STAT_START])))
    return tree


def is_running(process: Process) -> bool:
    """Whether ``process`` is still there (a zombie is not: it has ended, unreaped)."""
    fields = stat_fields(process[0])
    if fields is None or fields[STAT_STATE] == "Z":
        return False
    return int(fields[STAT_START]) == process[1]


def end_processes(processes: set[Process], grace_s: float = 15.0) -> None:
    """SIGTERM ``processes``, SIGKILL those still running after ``grace_s``; returns once
    none is running."""
    _signal(processes, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _still_running(processes) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    left = _still_running(processes)
    _signal(left, signal.SIGKILL)
    while _still_running(left):
        time.sleep(_POLL_S)


def _still_running(processes: set[Process]) -> set[Process]:
    # A child of this process that ended stays a zombie: never reaped here, so that whoever
    # started it (PySpark's Popen) still learns how it ended.
    return {process for process in processes if is_running(process)}


def _signal(processes: set[Process], signum: signal.Signals) -> None:
    for process in processes:
        if is_running(process):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process[0], signum)


class DemoStopped(KmqError):
    """The demo was asked to stop (Ctrl-C, SIGTERM) before it finished."""


@contextlib.contextmanager
def stoppable_spark(
    stop: threading.Event, *, quiet: bool, jvm_log: Path | None
) -> Iterator[SparkSession]:
    """A local Spark session for the block; it ends with the block, and so does every process
    it started (the JVM, its Python workers).

    When ``stop`` is set while Spark starts, its processes are ended at once and
    :class:`DemoStopped` is raised; while the block runs, Spark's jobs are cancelled (the call
    waiting on one fails). This process's Ctrl-C handler is kept: PySpark's would replace it.
    """
    before = child_tree()
    started: list[SparkSession] = []
    left = threading.Event()

    def on_stop() -> None:
        while not left.wait(STOP_POLL_S):
            if not stop.is_set():
                continue
            if started:
                with contextlib.suppress(Exception):
                    started[0].sparkContext.cancelAllJobs()
            else:
                end_processes(child_tree() - before)
            return

    watcher = threading.Thread(target=on_stop, name="demo-stop", daemon=True)
    watcher.start()
    ctrl_c = signal.getsignal(signal.SIGINT)
    try:
        try:
            spark = local_session("kmq demo", quiet=quiet, jvm_log=jvm_log)
        except KeyboardInterrupt:  # PySpark's handler, set just before local_session returned
            stop.set()
            raise DemoStopped from None
        _keep_handler(ctrl_c)
        started.append(spark)
        if stop.is_set():
            raise DemoStopped
        yield spark
    finally:
        left.set()
        watcher.join()
        _keep_handler(ctrl_c)
        try:
            if started:
                started[0].stop()
        except Exception:
            if not stop.is_set():
                raise
        finally:
            end_processes(child_tree() - before)


def _keep_handler(handler: Any) -> None:
    """Put back this process's SIGINT ``handler`` (in the main thread; PySpark sets its own)."""
    if threading.current_thread() is threading.main_thread() and handler is not None:
        signal.signal(signal.SIGINT, handler)
