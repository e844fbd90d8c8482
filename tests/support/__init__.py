import os

from kmq_dagster.crash_guard import CHILD_ENV


def worker_pid() -> int:
    """The PID of the ``kmq worker`` a test started, from inside its handler: under the crash
    guard the handler runs in the supervisor's child, and the supervisor (its parent) keeps
    the PID that was started."""
    return os.getppid() if os.environ.get(CHILD_ENV) else os.getpid()
