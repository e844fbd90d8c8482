"""Replays that run in the background of the console process, with progress and cancel.

A replay can take minutes (a rate limit, a large DLQ); it runs on its own thread so the page
stays responsive, every session sees it on the Actions page, and anyone with the operator
role can cancel it there. The registry lives in the console's process: restarting the console
forgets finished jobs, while the audit log keeps every action for good.

The replay itself records its action before its first effect and each chunk of copies as it
goes (``kmq_dagster.operations.replay``), so nothing here is needed for the audit trail to hold.
When the console stops (SIGTERM, Ctrl-C: Streamlit then ends the process normally), every
running replay is asked to stop after its chunk and given :data:`SHUTDOWN_WAIT_S` to record
how it ended; after a SIGKILL, the next look at the store reads it ``interrupted``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kmq_dagster.core.replay_request import StopRequest

log = logging.getLogger(__name__)

RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
#: Finished jobs kept for display.
KEEP_FINISHED = 50
#: How long a stopping console waits for its running replays to record how they ended
#: (below the 15 s after which ``ConsoleService`` and most service managers SIGKILL).
SHUTDOWN_WAIT_S = 10.0


@dataclass
class ReplayJob:
    """One replay started from the console."""

    actor: str
    queue_topic: str
    group_id: str
    target_topic: str
    #: Dead letters the replay is expected to move (from the audit store).
    expected: int
    #: The replay's id, as the audit trail names it (pages show this one).
    replay_id: str = ""
    #: This job's key in the console's registry (one replay id may be started again).
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    state: str = RUNNING
    scanned: int = 0
    replayed: int = 0
    summary: str = ""
    cancel: StopRequest = field(default_factory=StopRequest, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def fraction_done(self) -> float:
        """Progress between 0 and 1 (1 once the job ended, whatever its outcome)."""
        if self.state != RUNNING:
            return 1.0
        return min(1.0, self.replayed / self.expected) if self.expected else 0.0

    def update(self, scanned: int, replayed: int) -> None:
        self.scanned, self.replayed = scanned, replayed


Work = Callable[[ReplayJob], str]

_jobs: dict[str, ReplayJob] = {}
_lock = threading.Lock()


def start(job: ReplayJob, work: Work) -> ReplayJob:
    """Run ``work(job)`` on a thread; it returns the summary and may raise."""

    def run() -> None:
        try:
            job.summary = work(job)
            job.state = CANCELLED if job.cancel.is_set() else FINISHED
        except Exception as exc:  # the job must end visibly whatever went wrong
            log.warning("replay job %s failed", job.id, exc_info=True)
            job.summary, job.state = f"failed: {exc}", FAILED
        finally:
            job.finished_at = datetime.now(UTC)

    with _lock:
        _jobs[job.id] = job
        ended = [j for j in _jobs.values() if j.state != RUNNING]
        for old in sorted(ended, key=lambda j: j.started_at)[:-KEEP_FINISHED]:
            del _jobs[old.id]
    # A daemon thread: it must not keep a stopping console alive beyond SHUTDOWN_WAIT_S.
    job.thread = threading.Thread(target=run, name=f"kmq-replay-{job.id}", daemon=True)
    job.thread.start()
    return job


def stop_all(reason: str, timeout_s: float = SHUTDOWN_WAIT_S) -> list[ReplayJob]:
    """Ask every running job to stop after its chunk (``reason`` goes into its audited
    outcome) and wait up to ``timeout_s`` in all for them to end; returns those that did not."""
    running = [job for job in jobs() if job.state == RUNNING]
    for job in running:
        job.cancel.request(reason)
    deadline = time.monotonic() + timeout_s
    for job in running:
        if job.thread is not None:
            job.thread.join(max(0.0, deadline - time.monotonic()))
    left = [job for job in running if job.state == RUNNING]
    if left:
        log.warning("%d replays did not end within %g s of the shutdown", len(left), timeout_s)
    return left


# Runs when the console's process ends normally (Streamlit's own SIGTERM and Ctrl-C handling
# ends it so), while the daemon replay threads still run.
atexit.register(stop_all, "the console shut down (SIGTERM or Ctrl-C)")


def jobs() -> list[ReplayJob]:
    """Every job this console process knows, newest first."""
    with _lock:
        return sorted(_jobs.values(), key=lambda job: job.started_at, reverse=True)


def find(job_id: str) -> ReplayJob | None:
    with _lock:
        return _jobs.get(job_id)
