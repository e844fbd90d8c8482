"""The audit store down: PostgreSQL stopped for ``down_s`` under ``kmq ingest`` and a worker
whose circuit breaker lives in that store.

Both must ride through (the same processes before and after), nothing may be lost, and once
the ingester has caught up the store must hold each dead letter of the DLQ exactly once.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import distinct, func, select, tuple_

from kmq_dagster.audit.local_postgres import PostgresServer
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.bench.common import Report
from kmq_dagster.bench.fault_setup import Scenario, ScenarioError, Workload, progress_reporter
from kmq_dagster.bench.tally import topic_values

#: Share of the messages processed before PostgreSQL is stopped.
FAULT_AT_SHARE = 0.25


def audit_workload(messages: int) -> Workload:
    return Workload(messages=messages, poison_share=0.1, failure_rate=0.02, work_ms=0.5)


def audit_store_down(
    report: Report, *, messages: int = 10_000, down_s: float = 30.0, timeout_s: float = 600
) -> dict[str, Any]:
    """Stop PostgreSQL for ``down_s`` mid-stream; returns figures, with the store's rows."""
    with PostgresServer() as postgres, Scenario("audit", audit_workload(messages), report) as run:
        store = AuditStore(postgres.url)  # migrated before the processes start
        try:
            ledger = run.send()
            began = time.monotonic()
            crew = [
                run.worker("--breaker", "--audit-url", postgres.url),
                run.tracker(),
                run.fleet.start("ingest", "ingest", *run.queue_args(), "--audit-url", postgres.url),
            ]
            run.wait_for_progress(FAULT_AT_SHARE, timeout_s)
            report(f"audit: PostgreSQL stopped for {down_s:g} s")
            postgres.halt()
            time.sleep(down_s)  # the outage's length, not a wait for a condition
            postgres.resume()
            report("audit: PostgreSQL back")
            ledger.wait_until_accounted(timeout_s, progress_reporter(report, "audit"))
            dead_letters = len(
                topic_values(run.settings, run.queue.dlq_topic, run.queue.dlq_partitions)
            )
            rows, distinct_rows = _wait_for_rows(store, run, dead_letters, timeout_s)
            seconds = time.monotonic() - began
            run.require_alive(crew)
        finally:
            store.close()
        figures = ledger.outcome(seconds).figures()
        figures.update(
            dead_letter_rows=rows,
            duplicate_rows=rows - distinct_rows,
            missing_rows=dead_letters - distinct_rows,
            down_s=down_s,
        )
        return figures


def _wait_for_rows(
    store: AuditStore, run: Scenario, wanted: int, timeout_s: float
) -> tuple[int, int]:
    """Wait until the ingester stored ``wanted`` rows; returns (rows, distinct coordinates)."""
    coordinates = tuple_(DeadLetter.dlq_topic, DeadLetter.dlq_partition, DeadLetter.dlq_offset)
    query = select(func.count(), func.count(distinct(coordinates))).where(
        DeadLetter.queue_topic == run.queue.topic
    )
    deadline = time.monotonic() + timeout_s
    while True:
        with store.engine.connect() as connection:
            rows, distinct_rows = connection.execute(query).one()
        if rows >= wanted or time.monotonic() > deadline:
            return int(rows), int(distinct_rows)
        if not run.fleet.processes[-1].alive():
            raise ScenarioError(f"audit: kmq ingest exited:\n{run.fleet.processes[-1].log_tail()}")
        time.sleep(0.5)
