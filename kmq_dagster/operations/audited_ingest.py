"""An operator's ingest of a DLQ into the audit store, audited before its effect (invariant 8).

``kmq ingest`` and the Dagster ``ingest_<queue>`` job both run it: the ``ingest`` action is
written running before the first dead letter is stored and finished with how many were stored,
however the ingest ends (a SIGKILL leaves it to be read ``interrupted``; see
``kmq_dagster.audit.actions``). It takes no lease: storing dead letters is idempotent and
overlaps nothing a replay or discard changes, and a continuous ingest would hold one for ever.
"""

from __future__ import annotations

import threading

from kmq_dagster.audit.actions import STOPPED, SUCCEEDED, start_action
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.replay_request import stop_reason
from kmq_dagster.errors import AuditStoreError
from kmq_dagster.operations.dlq_ingester import DlqIngester, IngestStats


def run_ingest(
    ingester: DlqIngester,
    store: AuditStore,
    *,
    actor: str,
    stop: threading.Event | None = None,
    timeout_s: float = 60,
) -> IngestStats:
    """Ingest what the DLQ holds now (no ``stop``), or until ``stop`` is set; audited.

    Raises:
        AuditStoreError: the store refused a write (the message says nothing is lost).
    """
    queue = ingester.queue
    if ingester.from_start is None:  # before this ingest's own action is recorded
        ingester.from_start = not store.has_ingested(queue.topic, queue.group)
    action = start_action(
        store, kind="ingest", actor=actor, queue_topic=queue.topic, group_id=queue.group,
        selection="every dead letter" if stop is None else "every dead letter, until stopped",
        target=None, dry_run=False,
    )  # fmt: skip
    try:
        # ``run`` rides through a store that is down (it retries the batch at hand); storing
        # once fails on the first refused write.
        with store.writing("store the dead letters"):
            if stop is None:
                ingester.ingest_available(timeout_s)
            else:
                ingester.run(stop)
    except BaseException as exc:
        note = action.fail(
            f"failed: {exc or type(exc).__name__}; by then {ingester.describe_stats()}",
            count=ingester.stats.stored,
        )
        if isinstance(exc, AuditStoreError):
            raise AuditStoreError(
                f"{exc}{note}; nothing is lost: the DLQ keeps every dead letter, and an ingest "
                "resumes where the store stopped taking them"
            ) from None
        raise
    stopped = stop is not None and stop.is_set()
    action.finish(
        STOPPED if stopped else SUCCEEDED,
        ingester.stats.stored,
        _stopped_by(stop) + ingester.describe_stats(),
    )
    return ingester.stats


def _stopped_by(stop: threading.Event | None) -> str:
    """``stopped (WHY): `` once ``stop`` is set (``stopped: `` if it gives no reason)."""
    if stop is None or not stop.is_set():
        return ""
    reason = stop_reason(stop)
    return "stopped: " if reason == "cancelled" else f"stopped ({reason}): "
