"""The daily jobs on a real SQLite audit store: retention archives and removes old handled
rows (audited) and keeps unhandled dead letters; the digest counts dead letters by queue and
cause into run metadata and a real webhook; processing on a cron."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from dagster import DagsterInstance, Definitions

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.core.headers import ERROR_TYPE
from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.resources import AuditStoreResource
from tests.dagster.receivers import http_receiver

DAY_MS = 86_400_000


def add_dead_letters(audit: AuditStoreResource, items: list[tuple[str, str, int, str]]) -> None:
    """(queue topic, error type, age in days, status) per dead letter."""
    now_ms = int(time.time() * 1000)
    rows = []
    for offset, (topic, error_type, age_days, _status) in enumerate(items):
        rows.append(
            dead_letter_row(
                dlq_topic=f"{topic}.g.dlq",
                partition=0,
                offset=offset,
                key=b"k",
                value=b"v",
                headers=[(ERROR_TYPE, error_type.encode())],
                timestamp_ms=now_ms - age_days * DAY_MS,
                queue_topic=topic,
                group_id="g",
                ingested_at=datetime.now(UTC),
            )
        )
    store = audit.get_store()
    store.add_dead_letters(rows)
    for offset, (topic, _error, _age, status) in enumerate(items):
        store.set_status(f"{topic}.g.dlq", [(0, offset)], status)


def definitions(audit: AuditStoreResource, alerts: KmqAlertsResource) -> Definitions:
    return kmq_definitions([QueueSpec(Queue("orders", "g"))], audit=audit, alerts=alerts)


def test_retention_archives_and_removes_old_handled_rows_and_is_audited(
    audit: AuditStoreResource, instance: DagsterInstance, tmp_path: Path
) -> None:
    add_dead_letters(audit, [
        ("orders", "ValueError", 100, "replayed"),   # old and handled: removed
        ("orders", "ValueError", 100, "new"),        # old but nobody looked at it: kept
        ("orders", "ValueError", 1, "discarded"),    # recent: kept
    ])  # fmt: skip
    job = definitions(audit, KmqAlertsResource()).resolve_job_def("kmq_audit_retention")
    config = {"retention_days": 30, "archive_dir": str(tmp_path / "archive")}

    result = job.execute_in_process(
        instance=instance, run_config={"ops": {"apply_audit_retention": {"config": config}}}
    )

    assert result.output_for_node("apply_audit_retention") == 1
    store = audit.get_store()
    assert sorted(d.status for d in store.dead_letters()) == ["discarded", "new"]
    (archive,) = (tmp_path / "archive").iterdir()
    (archived,) = [json.loads(line) for line in archive.read_text().splitlines()]
    assert (archived["kind"], archived["status"]) == ("dead_letter", "replayed")
    (action,) = store.actions()
    assert (action.kind, action.count, action.target) == ("retention", 1, str(archive))


def test_the_digest_counts_dead_letters_by_queue_and_cause_for_the_sinks(
    audit: AuditStoreResource, instance: DagsterInstance
) -> None:
    add_dead_letters(audit, [
        ("orders", "ValueError", 0, "new"), ("orders", "ValueError", 0, "new"),
        ("orders", "TimeoutError", 0, "new"), ("invoices", "KeyError", 0, "new"),
        ("orders", "ValueError", 3, "new"),                    # before the digest's day
    ])  # fmt: skip
    with http_receiver() as hook:
        job = definitions(audit, KmqAlertsResource(webhook_url=hook.url)).resolve_job_def(
            "kmq_dead_letter_digest"
        )
        result = job.execute_in_process(instance=instance)
    (alert,) = hook.bodies()
    assert alert["title"] == "4 dead letters in the last 24 h"
    assert alert["details"]["counts"] == [
        ["orders", "g", "ValueError", 2], ["invoices", "g", "KeyError", 1],
        ["orders", "g", "TimeoutError", 1],
    ]  # fmt: skip
    (materialized,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = materialized.step_output_data.metadata
    assert metadata["dead_letters"].value == 4
    assert "| orders | g | ValueError | 2 |" in str(metadata["by_queue_and_cause"].value)


def test_a_queue_can_be_processed_on_a_cron_instead() -> None:
    spec = QueueSpec(Queue("orders", "g"), function=print, output_path="/tmp/x",
                     processing_cron="*/15 * * * *")  # fmt: skip
    repository = kmq_definitions([spec]).get_repository_def()
    schedule = repository.get_schedule_def("process_on_schedule_orders__g")
    assert (schedule.job_name, schedule.cron_schedule) == ("process_orders__g", "*/15 * * * *")
