"""Replays that run in the background of the console process, with progress and cancel.

A replay can take minutes (a rate limit, a large DLQ); it runs on its own thread so the page
stays responsive, every session sees it on the Actions page, and anyone with the operator
role can cancel it there. The registry lives in the console's process: restarting the console
forgets finished jobs, while the audit log keeps every action for good.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

log = logging.getLogger(__name__)

RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
#: Finished jobs kept for display.
KEEP_FINISHED = 50


@dataclass
class ReplayJob:
    """One replay started from the console."""

    actor: str
    queue_topic: str
    group_id: str
    target_topic: str
    #: Dead letters the replay is expected to move (from the audit store).
    expected: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    state: str = RUNNING
    scanned: int = 0
    replayed: int = 0
    summary: str = ""
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

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
    threading.Thread(target=run, name=f"kmq-replay-{job.id}", daemon=True).start()
    return job


def jobs() -> list[ReplayJob]:
    """Every job this console process knows, newest first."""
    with _lock:
        return sorted(_jobs.values(), key=lambda job: job.started_at, reverse=True)


def find(job_id: str) -> ReplayJob | None:
    with _lock:
        return _jobs.get(job_id)
