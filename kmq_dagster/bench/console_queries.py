"""What ``kmq bench console`` measures: the console's queries with a million dead letters.

Each store is filled through :meth:`AuditStore.add_dead_letters` (so error patterns and header
rows are what ingestion writes) with dead letters shaped like production's: four queues of
different sizes, causes of skewed frequency, 80% new, a month of failures, JSON values, a
trace id and a tenant header. Then every query the Dead letters page runs is timed, median of
several runs after a warm-up: one page of 50 rows under each filter a support engineer uses,
the counts by cause, and one dead letter's detail with its history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kmq_dagster.audit import browse
from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.history import history
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.bench.common import Report
from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
)

BATCH = 5_000
#: (queue, group, share of the dead letters)
QUEUES = (("orders", "billing", 0.5), ("orders", "shipping", 0.25),
          ("payments", "ledger", 0.2), ("emails", "sender", 0.05))  # fmt: skip
#: (error type, message template); earlier causes are more frequent (weights 1/rank).
CAUSES = (
    ("TimeoutError", "payments API timed out after {n} s"),
    ("KeyError", "'customer_id'"),
    ("ValueError", "amount {n} is negative"),
    ("HTTPError", "503 Service Unavailable from https://stock.internal/v2/items/{n}"),
    ("ConnectionError", "connection to 10.0.{n}.7:5432 refused"),
    ("KeyError", "'amount'"),
    ("ValidationError", "order {n} has no lines"),
    ("RuntimeError", "inventory lock {n} held by another worker"),
    *((f"Error{k}", f"rare failure {k} of item {{n}}") for k in range(22)),
)
STATUS_WEIGHTS = {"new": 80, "replayed": 15, "discarded": 5}
TENANTS = 50
DAYS = 30


@dataclass
class BackendFigures:
    """Medians in milliseconds, per named query."""

    page_ms: dict[str, float] = field(default_factory=dict)
    counts_ms: dict[str, float] = field(default_factory=dict)
    detail_ms: float = 0.0

    def summary(self) -> dict[str, float]:
        """The slowest filter's median: the figure a target holds for every filter."""
        return {
            "page_ms": round(max(self.page_ms.values()), 1),
            "counts_ms": round(max(self.counts_ms.values()), 1),
            "detail_ms": round(self.detail_ms, 1),
        }


def dead_letter_rows(first: int, count: int, total: int, now: datetime) -> list[dict[str, Any]]:
    """Rows ``first`` .. ``first + count - 1`` of a store of ``total`` (deterministic)."""
    rng = random.Random(first)
    weights = [1 / (rank + 1) for rank in range(len(CAUSES))]
    rows = []
    for n in range(first, first + count):
        topic, group = queue_of(n)
        error_type, template = rng.choices(CAUSES, weights)[0]
        failed = now - timedelta(seconds=DAYS * 86_400 * (total - n) / total)
        value = {"order": n, "tenant": n % TENANTS, "amount": rng.randint(1, 10_000),
                 "lines": [{"sku": f"sku-{rng.randint(1, 999)}", "qty": 1}]}  # fmt: skip
        if n % 10 == 0:
            value["card_number"] = "4111111111111111"
        kmq = [(ERROR_TYPE, error_type.encode()),
               (ERROR_MESSAGE, template.format(n=rng.randint(1, 99_999)).encode()),
               (DLQ_REASON, b"failed 4 attempts, the last with " + error_type.encode()),
               (ORIGINAL_TOPIC, topic.encode()), (ORIGINAL_PARTITION, str(n % 8).encode()),
               (ORIGINAL_OFFSET, str(n).encode())]  # fmt: skip
        row = dead_letter_row(
            dlq_topic=f"{topic}.{group}.dlq", partition=n % 8, offset=n,
            key=f"order-{n}".encode(), value=json.dumps(value).encode(),
            headers=[("trace-id", f"{n:016x}".encode()), ("tenant", f"t{n % TENANTS}".encode()),
                     *kmq],
            timestamp_ms=int(failed.timestamp() * 1000), queue_topic=topic, group_id=group,
            ingested_at=failed,
        )  # fmt: skip
        row["status"] = rng.choices(list(STATUS_WEIGHTS), list(STATUS_WEIGHTS.values()))[0]
        rows.append(row)
    return rows


def queue_of(n: int) -> tuple[str, str]:
    """The queue and group of dead letter ``n``: shares as in ``QUEUES``, interleaved in time."""
    share = (n * 2_654_435_761 % 2**32) / 2**32
    for topic, group, weight in QUEUES:
        if share < weight:
            return topic, group
        share -= weight
    return QUEUES[-1][0], QUEUES[-1][1]


def fill(store: AuditStore, total: int, report: Report) -> None:
    now = datetime.now(UTC)
    started = time.monotonic()
    for first in range(0, total, BATCH):
        store.add_dead_letters(dead_letter_rows(first, min(BATCH, total - first), total, now))
        done = first + min(BATCH, total - first)
        if done % 100_000 == 0 or done == total:
            report(f"  {done:,} dead letters stored ({done / (time.monotonic() - started):,.0f}/s)")


def page_filters(total: int, now: datetime) -> dict[str, DeadLetterFilter]:
    """The filters a support engineer uses, with values that exist in the filled store."""
    orders = DeadLetterFilter(queue_topic="orders", group_id="billing")
    rare = total // 3
    topic, group = queue_of(rare)
    rare_queue = DeadLetterFilter(queue_topic=topic, group_id=group)

    def of(**fields: Any) -> DeadLetterFilter:
        return dataclasses.replace(orders, **fields)

    return {
        "queue, status new": of(status="new"),
        "+ cause": of(status="new", error_type="TimeoutError",
                      error_pattern="payments API timed out after <n> s"),
        "+ rare cause": of(status="new", error_type="Error21",
                           error_pattern="rare failure <n> of item <n>"),
        "+ error type": of(error_type="KeyError"),
        "key (1 row)": dataclasses.replace(rare_queue, key=f"order-{rare}".encode()),
        "+ header trace-id (1 row)": DeadLetterFilter(header=("trace-id", f"{rare:016x}")),
        "+ header tenant (2%)": of(header=("tenant", "t7")),
        "+ reason": of(reason="the last with ValueError"),
        "+ text in value or message (1 row)": dataclasses.replace(
            rare_queue, search=f'"order": {rare},'
        ),
        "text in value or message, every queue (1 row)": DeadLetterFilter(
            search=f'"order": {rare},'
        ),
        "+ last day": of(since=now - timedelta(days=1)),
        "everything": DeadLetterFilter(),
    }  # fmt: skip


def median_ms(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up: caches and plans, as a console that has been open for a while has
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def measure(store: AuditStore, total: int, runs: int, report: Report) -> BackendFigures:
    figures = BackendFigures()
    filters = page_filters(total, datetime.now(UTC))
    for name, where in filters.items():
        first = browse.page(store, where)
        figures.page_ms[name] = median_ms(functools.partial(browse.page, store, where), runs)
        if first.next_cursor is not None:
            after = first.next_cursor
            second = functools.partial(browse.page, store, where, after=after)
            figures.page_ms[name + ", page 2"] = median_ms(second, runs)
        report(f"  page, {name}: {figures.page_ms[name]:.1f} ms ({len(first.rows)} rows)")
    for name in ("queue, status new", "+ error type", "everything"):
        where = filters[name]
        counts = functools.partial(browse.cause_counts, store, where)
        figures.counts_ms[name] = median_ms(counts, runs)
        report(f"  counts by cause, {name}: {figures.counts_ms[name]:.1f} ms")
    target = browse.page(store, filters["key (1 row)"]).rows[0].id

    def detail() -> None:
        found = browse.dead_letter(store, target)
        assert found is not None
        history(store, found)

    figures.detail_ms = median_ms(detail, runs)
    report(f"  detail with history: {figures.detail_ms:.1f} ms")
    return figures


def run_console_benchmark(
    stores: dict[str, Callable[[], contextlib.AbstractContextManager[str]]],
    total: int,
    runs: int,
    report: Report,
) -> dict[str, Any]:
    """Fill each named store with ``total`` dead letters and time the console's queries."""
    result: dict[str, Any] = {"dead_letters": total}
    for name, url_of in stores.items():
        with url_of() as url:
            store = AuditStore(url)
            report(f"{name}: filling with {total:,} dead letters")
            fill(store, total, report)
            started = time.perf_counter()
            browse.refresh_statistics(store)  # what the console does when it starts
            report(f"{name}: planner statistics refreshed in "
                   f"{(time.perf_counter() - started) * 1000:.0f} ms")  # fmt: skip
            report(f"{name}: timing, median of {runs} runs")
            result[name] = measure(store, total, runs, report).summary()
            store.close()
    return result
