"""What the console does to dead letters: replay and discard, each checking the actor's role.

This is the one console module that calls the replay library
(:func:`kmq_dagster.operations.replay.replay_dead_letters`) and the store's discard: the console has
no second implementation of either. Any filter of the Dead letters page, or a set of selected
rows, is resolved in the audit store into the DLQ offsets it selects; the replay moves exactly
those, so replay and discard act on the same dead letters the page shows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kmq_dagster.audit.browse import DlqSelection, dlq_selection
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.models import Action
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import jobs
from kmq_dagster.console.auth import OPERATOR, Principal, require_role
from kmq_dagster.core.replay import DEFAULT_MAX_REPLAYS, TO_RETRY, ReplaySelection
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.foreign_dlq import open_stored_dead_letters
from kmq_dagster.kafka.queues import OpenedQueue
from kmq_dagster.operations.replay import (
    ReplayReport,
    ReplayRequest,
    replay_dead_letters,
    target_topic,
)
from kmq_dagster.settings import KmqSettings


@dataclass(frozen=True)
class OffsetsSelection(ReplaySelection):
    """Exactly the DLQ offsets a console filter resolved to, however many, described by the
    filter and a digest (the same rows give the same replay id, so a replay that is started
    twice or interrupted resumes instead of repeating)."""

    label: str = ""

    @classmethod
    def of(cls, selection: DlqSelection, where: DeadLetterFilter) -> OffsetsSelection:
        spans = {p: _spans(offsets) for p, offsets in selection.offsets.items()}
        digest = hashlib.sha256(repr(sorted(spans.items())).encode()).hexdigest()[:12]
        label = f"console filter {where.describe()}: {selection.count} dead letters ({digest})"
        return cls(offsets=spans, label=label)

    def describe(self) -> str:
        return self.label


@dataclass(frozen=True)
class ReplayPlan:
    """A replay the console is asked for: which dead letters, where to, how fast."""

    where: DeadLetterFilter
    target: str = TO_RETRY
    rate_per_s: float | None = None
    max_replays: int = DEFAULT_MAX_REPLAYS
    #: A topic the operator named for the copies, instead of where ``target`` sends them.
    to_topic: str | None = None


@dataclass(frozen=True)
class ReplayPreview:
    """A dry run's answer, for the confirmation dialog."""

    selection: DlqSelection
    target_topic: str
    report: ReplayReport


def preview_replay(
    principal: Principal, settings: KmqSettings, store: AuditStore, plan: ReplayPlan
) -> ReplayPreview:
    """Dry-run the replay ``plan`` describes (audited as a dry run).

    Raises:
        PermissionDeniedError: ``principal`` is not an operator.
        ConfigError: the filter selects nothing or several groups; no retry topic.
    """
    require_role(principal, OPERATOR, "replaying dead letters")
    selection, opened, request = _request(settings, store, plan, dry_run=True)
    report = replay_dead_letters(opened, request, audit=store, actor=principal.name)
    return ReplayPreview(selection, target_topic(opened.queue, request), report)


def start_replay(
    principal: Principal, settings: KmqSettings, store: AuditStore, plan: ReplayPlan
) -> jobs.ReplayJob:
    """Start the replay ``plan`` describes in the background; see :mod:`.jobs`.

    Raises:
        PermissionDeniedError: ``principal`` is not an operator.
        ConfigError: the filter selects nothing or several groups; no retry topic.
    """
    require_role(principal, OPERATOR, "replaying dead letters")
    selection, opened, request = _request(settings, store, plan, dry_run=False)
    job = jobs.ReplayJob(
        principal.name, selection.queue_topic, selection.group_id,
        target_topic(opened.queue, request),
        expected=selection.count, replay_id=request.id_for(opened.queue),
    )  # fmt: skip

    def work(job: jobs.ReplayJob) -> str:
        report = replay_dead_letters(
            opened, request, audit=store, actor=principal.name, cancel=job.cancel,
            progress=lambda r: job.update(r.scanned, r.replayed),
        )  # fmt: skip
        job.update(report.scanned, report.replayed)
        return report.summary()

    return jobs.start(job, work)


def cancel_replay(principal: Principal, job: jobs.ReplayJob) -> None:
    """Ask a running replay to stop after its current chunk.

    Raises:
        PermissionDeniedError: ``principal`` is not an operator.
    """
    require_role(principal, OPERATOR, "cancelling a replay")
    job.cancel.request(f"cancelled by {principal.name}")


def discard(
    principal: Principal,
    store: AuditStore,
    where: DeadLetterFilter,
    *,
    reason: str,
    dry_run: bool = False,
) -> int:
    """Discard the ``new`` dead letters ``where`` selects, with ``reason`` (audited).

    Returns:
        How many were (or, in a dry run, would be) discarded.

    Raises:
        PermissionDeniedError: ``principal`` is not an operator.
        ConfigError: no reason given; a replay or discard of these dead letters is running.
    """
    require_role(principal, OPERATOR, "discarding dead letters")
    if not reason.strip():
        raise ConfigError("a discard needs a reason")
    return store.discard(
        where, actor=principal.name, dry_run=dry_run, reason=reason.strip(),
        on_wait=_refuse_while_running,
    )  # fmt: skip


def _refuse_while_running(action: Action) -> None:
    """A page must not hang behind a long replay: a discard that would wait is refused."""
    raise ConfigError(
        f"action #{action.id} ({action.kind} by {action.actor}) is running on these dead "
        "letters; discard once it has ended"
    )


def _request(
    settings: KmqSettings, store: AuditStore, plan: ReplayPlan, *, dry_run: bool
) -> tuple[DlqSelection, OpenedQueue, ReplayRequest]:
    """The dead letters the filter selects, their queue as provisioned (or their foreign
    dead-letter topic), and the request."""
    selection = dlq_selection(store, plan.where)
    queue = open_stored_dead_letters(
        settings, selection.queue_topic, selection.group_id, selection.dlq_topic
    )
    request = ReplayRequest(
        OffsetsSelection.of(selection, plan.where), target=plan.target, dry_run=dry_run,
        rate_per_s=plan.rate_per_s, max_replays=plan.max_replays, to_topic=plan.to_topic,
    )  # fmt: skip
    return selection, queue, request


def _spans(offsets: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted offsets as inclusive (first, last) runs."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] + 1 == offset:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return tuple(runs)
