"""Audit-store housekeeping: retention of old rows (archived or purged) and dead-letter counts
for digests. Every query is built from SQLAlchemy expressions (bound parameters only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select

from kmq_dagster.audit.actions import ANY, RUNNING, SUCCEEDED, start_action
from kmq_dagster.audit.models import Action, DeadLetter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.wording import counted
from kmq_dagster.errors import AuditStoreError


@dataclass(frozen=True)
class RetentionReport:
    """What one retention pass removed (and archived, if it did)."""

    cutoff: datetime
    dead_letters: int
    actions: int
    archive: str | None

    def describe(self) -> str:
        kept = f"archived to {self.archive} and " if self.archive else ""
        return (
            f"{kept}removed {counted(self.dead_letters, 'dead letter')} and "
            f"{counted(self.actions, 'action')} "
            f"older than {self.cutoff:%Y-%m-%d %H:%M:%S %Z}"
        )


def apply_retention(
    store: AuditStore,
    cutoff: datetime,
    *,
    archive_dir: Path | None = None,
    dry_run: bool = False,
    actor: str = "unknown",
    selection: str | None = None,
) -> RetentionReport:
    """Remove dead letters (by last failure) and actions older than ``cutoff``; with
    ``archive_dir``, first write them there as JSON lines. Dead letters still ``new`` are kept:
    nobody has looked at them yet, and running actions too.

    Audited before its effect (docs/design.md, "Audit before effect") as a ``retention`` by
    ``actor`` (``selection`` describes the cutoff), holding a lease over every queue.

    Raises:
        AuditStoreError: the store refused a write (nothing was removed then: one transaction).
    """
    action = start_action(
        store, kind="retention", actor=actor, queue_topic=ANY, group_id=ANY,
        selection=selection or f"older than {cutoff:%Y-%m-%d %H:%M:%S %Z}", target=None,
        dry_run=dry_run,
    )  # fmt: skip
    try:
        if not dry_run:
            action.acquire()
        with store.writing("remove old rows"):
            report = _remove_old_rows(store, cutoff, archive_dir, dry_run)
    except BaseException as exc:
        note = action.fail(f"failed, nothing removed: {exc or type(exc).__name__}", count=0)
        if isinstance(exc, AuditStoreError):
            raise AuditStoreError(f"{exc}; nothing was removed{note}") from None
        raise
    action.finish(
        SUCCEEDED, report.dead_letters + report.actions, report.describe(), target=report.archive
    )
    return report


def _remove_old_rows(
    store: AuditStore, cutoff: datetime, archive_dir: Path | None, dry_run: bool
) -> RetentionReport:
    old_letters = (DeadLetter.last_failure_at < cutoff) & (DeadLetter.status != "new")
    old_actions = (Action.at < cutoff) & (Action.state != RUNNING)
    archive = None
    with store.engine.begin() as connection:
        letters = connection.execute(select(DeadLetter).where(old_letters)).mappings().all()
        actions = connection.execute(select(Action).where(old_actions)).mappings().all()
        if archive_dir is not None and (letters or actions) and not dry_run:
            archive_dir.mkdir(parents=True, exist_ok=True)
            target = archive_dir / f"kmq-audit-before-{cutoff:%Y%m%dT%H%M%S}.jsonl"
            with target.open("a") as out:
                for kind, rows in (("dead_letter", letters), ("action", actions)):
                    for row in rows:
                        out.write(json.dumps({"kind": kind, **dict(row)}, default=_plain) + "\n")
            archive = str(target)
        if not dry_run:
            connection.execute(delete(DeadLetter).where(old_letters))
            connection.execute(delete(Action).where(old_actions))
    return RetentionReport(cutoff, len(letters), len(actions), archive)


def dead_letter_counts(store: AuditStore, since: datetime) -> list[tuple[str, str, str, int]]:
    """(queue topic, group, error type, count) of dead letters since ``since``, most first."""
    count = func.count().label("count")
    query = (
        select(DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.error_type, count)
        .where(DeadLetter.last_failure_at >= since)
        .group_by(DeadLetter.queue_topic, DeadLetter.group_id, DeadLetter.error_type)
        .order_by(count.desc(), DeadLetter.queue_topic)
    )
    with store.engine.connect() as connection:
        return [(str(t), str(g), str(e), int(n)) for t, g, e, n in connection.execute(query)]


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
