"""A store that refuses the heartbeat of a running action (a full disk) costs the operator one
warning line, not a traceback every few seconds before the command's own output, and the
action goes on: once the store takes writes again, it finishes as usual. Real SQLite; the
refusal is SQLite's own "database or disk is full", raised for the heartbeat's UPDATE."""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

import pytest
from sqlalchemy import event

from kmq_dagster.audit import actions
from kmq_dagster.audit.actions import SUCCEEDED, start_action
from kmq_dagster.audit.store import AuditStore
from tests.kafka_helpers import wait_for


def test_a_refused_heartbeat_is_one_warning_line_and_the_action_goes_on(
    private_audit_store: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "HEARTBEAT_S", 0.05)
    store = AuditStore(private_audit_store)
    full = threading.Event()
    refused: list[int] = []

    def disk_full(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if full.is_set() and statement.lstrip().upper().startswith("UPDATE ACTIONS"):
            refused.append(1)
            raise sqlite3.OperationalError("database or disk is full")

    event.listen(store.engine, "before_cursor_execute", disk_full)
    with caplog.at_level(logging.DEBUG, logger="kmq_dagster.audit.actions"):
        action = start_action(store, kind="replay", actor="ana", queue_topic="orders",
                              group_id="billing", selection="every dead letter", target=None,
                              dry_run=False)  # fmt: skip
        full.set()
        assert wait_for(lambda: len(refused) >= 5, timeout_s=30)
        full.clear()
        action.finish(SUCCEEDED, 3, "replayed 3")

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].exc_info is None
    assert warnings[0].getMessage() == (
        f"the audit store refused the heartbeat of action {action.id} (the action goes on): "
        "(sqlite3.OperationalError) database or disk is full"
    )
    (row,) = store.actions(queue_topic="orders")
    assert (row.state, row.count) == (SUCCEEDED, 3)
    store.close()
