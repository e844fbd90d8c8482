"""``kmq bench audit``: DLQ ingest rows per second into SQLite and into PostgreSQL.

One DLQ is filled once with dead letters shaped like the retry router's (kmq headers, a
traceback, 200-byte values); each measurement ingests all of it into an empty store with its
own consumer group, alternating SQLite and PostgreSQL, and the median of the rounds is taken.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.bench.common import Report
from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.errors import KmqError
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import produce
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings

GROUP = "bench"
PARTITIONS = 2
VALUE = b"v" * 200


@dataclass
class AuditFigures:
    rows: int
    sqlite_runs: list[float]
    postgres_runs: list[float]

    def as_json(self) -> str:
        return json.dumps(
            {
                "sqlite_rows_per_s": round(statistics.median(self.sqlite_runs)),
                "postgres_rows_per_s": round(statistics.median(self.postgres_runs)),
                "rows": self.rows,
            }
        )


def fill_dlq(settings: KmqSettings, rows: int) -> Queue:
    """A new queue whose group DLQ holds ``rows`` dead letters."""
    queue = Queue(f"bench-audit-{uuid.uuid4().hex[:8]}", GROUP, partitions=PARTITIONS)
    topic = queue.topic
    dlq_partitions = provision_queue(settings, queue, delay_queue=False).opened.dlq_partitions
    producer = new_producer(settings, **{"linger.ms": 20})
    failure = Failure("TimeoutError", "payments API timed out after 30 s", "Traceback ...\n" * 20)
    for n in range(rows):
        origin = Origin(topic, n % PARTITIONS, n, 1_795_000_000_000 + n)
        headers = copy_headers(
            origin, GROUP, failure, attempt=4, dlq_reason="failed 4 attempts, the last with "
            "TimeoutError", first_failure_ms=1_795_000_000_000 + n,
        )  # fmt: skip
        produce(
            producer,
            queue.dlq_topic,
            key=str(n).encode(),
            value=VALUE,
            partition=n % dlq_partitions,
            headers=[*replace_headers([("trace", b"abc")], headers)],
        )
    producer.flush(120)
    return queue


def ingest_rate(settings: KmqSettings, queue: Queue, url: str, rows: int) -> float:
    """Ingest the whole DLQ of ``queue`` into the store at ``url``; rows per second."""
    store = AuditStore(url)
    ingester = DlqIngester(
        open_queue(settings, queue.topic, queue.group),
        store,
        consumer_group=f"bench-ingest-{uuid.uuid4().hex[:8]}",
    )
    try:
        stats = ingester.ingest_available(timeout_s=600)
    finally:
        ingester.close()
        store.close()
    if stats.stored != rows:
        raise KmqError(f"stored {stats.stored} of {rows} rows")
    return rows / stats.busy_s


def run_audit_benchmark(
    settings: KmqSettings,
    postgres_url: Callable[[], str],
    rows: int,
    report: Report,
    rounds: int = 3,
) -> AuditFigures:
    """``postgres_url()`` gives an empty PostgreSQL database for each measurement."""
    queue = fill_dlq(settings, rows)
    report(f"DLQ filled with {rows:,} dead letters; {rounds} rounds per store")
    figures = AuditFigures(rows, [], [])
    with tempfile.TemporaryDirectory(prefix="kmq-bench-audit-") as scratch:
        for round_number in range(1, rounds + 1):
            sqlite_url = f"sqlite:///{Path(scratch) / f'audit-{round_number}.db'}"
            figures.sqlite_runs.append(ingest_rate(settings, queue, sqlite_url, rows))
            figures.postgres_runs.append(ingest_rate(settings, queue, postgres_url(), rows))
            report(
                f"round {round_number}/{rounds}: SQLite {figures.sqlite_runs[-1]:,.0f} rows/s, "
                f"PostgreSQL {figures.postgres_runs[-1]:,.0f} rows/s"
            )
    return figures
