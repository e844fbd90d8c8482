"""A million messages in flight: the tracker's memory and its redelivery rate.

A consumer in this process takes every message of a filled queue and acknowledges none; a
``kmq tracker`` process (with ``--metrics-port``) tracks them all, then redelivers them all
when their visibility timeout passes. Its resident memory is read from ``/proc`` when every
message is in flight and at the end (the peak, ``VmHWM``); the rate is taken from its
``kmq_redeliveries_total`` counter, from the first redelivery to the last.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kmq_dagster.bench.common import Report, fill_topic
from kmq_dagster.bench.fault_setup import Scenario, ScenarioError, Workload
from kmq_dagster.broker.ports import free_port
from kmq_dagster.core.headers import (
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    header_value,
    normalize_headers,
)
from kmq_dagster.crash_guard import supervised_pid
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.kafka.topic_reader import assigned_reader, read_to_end
from kmq_dagster.metrics import scrape

#: Messages handed out per poll by the consumer that never acknowledges.
FETCH_BATCH = 10_000


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of ``pid`` in MB (``VmHWM``: its peak so far), from ``/proc``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise ScenarioError(f"no {field} for pid {pid}")


def million_in_flight(
    report: Report,
    *,
    messages: int = 1_000_000,
    partitions: int = 4,
    visibility_timeout_ms: int = 20_000,
    timeout_s: float = 300,
) -> dict[str, Any]:
    """Start ``messages`` messages, acknowledge none, let the tracker redeliver them all."""
    workload = Workload(
        messages=messages, partitions=partitions, visibility_timeout_ms=visibility_timeout_ms
    )
    with Scenario("inflight", workload, report) as scenario:
        settings, queue = scenario.settings, scenario.queue
        fill_topic(settings, queue.topic, messages, partitions)
        port = free_port()
        tracker = scenario.tracker("--metrics-port", str(port))
        began = time.monotonic()
        consumer = KmqConsumer(
            open_queue(settings, queue.topic, queue.group), batch_size=FETCH_BATCH
        )
        taken = restarted = 0
        try:
            while taken < messages:
                for record in consumer.poll_records(timeout_s=1.0):
                    if record.topic() == queue.topic:
                        taken += 1
                    else:  # redelivered before the start was done: started again, legitimately
                        restarted += 1
                if time.monotonic() - began > timeout_s:
                    raise ScenarioError(f"inflight: only {taken:,} of {messages:,} fetched")
            consumer.flush()
        finally:
            consumer.close()
        report(f"inflight: {taken:,} messages started, none acknowledged")
        if restarted:
            report(
                f"inflight: {restarted:,} of them were redelivered and started again before the "
                "rest were started (a slow start: each may be redelivered once more)"
            )
        # (after a slow start some are redelivered already: then in flight is not all of them)
        tracked = messages if not restarted else 1
        _wait_for_metric(scenario, port, "kmq_in_flight", tracked, timeout_s, exact=not restarted)
        tracker_pid = supervised_pid(tracker.pid)  # the tracker, not its crash guard
        rss_at_inflight = rss_mb(tracker_pid)
        report(f"inflight: the tracker tracks {messages:,}; RSS {rss_at_inflight:.1f} MB")
        first_s, done_s = _wait_for_metric(
            scenario, port, "kmq_redeliveries_total", messages, timeout_s
        )
        peak = rss_mb(tracker_pid, "VmHWM")
        scenario.require_alive([tracker])
        rate = messages / max(done_s - first_s, 1e-3)
        report(f"inflight: redelivered {messages:,} at {rate:,.0f} msg/s; peak RSS {peak:.1f} MB")
        copies, distinct = _redelivered_originals(scenario)
        return {
            "messages": messages,
            "lost": messages - distinct,
            "duplicates": copies - distinct,
            "started_again": restarted,
            "seconds": round(time.monotonic() - began, 1),
            "redelivered_per_s": round(rate),
            "tracker_rss_mb_at_inflight": round(rss_at_inflight, 1),
            "tracker_rss_peak_mb": round(peak, 1),
        }


def _wait_for_metric(
    scenario: Scenario,
    port: int,
    name: str,
    target: int,
    timeout_s: float,
    *,
    exact: bool = False,
) -> tuple[float, float]:
    """Poll the tracker's metric ``name`` until it reaches ``target``; returns when it first
    moved from zero and when it reached ``target`` (monotonic seconds)."""
    deadline = time.monotonic() + timeout_s
    first = None
    value = 0.0
    while time.monotonic() < deadline:
        try:
            value = scrape(port).get(name, 0.0)
        except OSError:
            value = 0.0  # not serving yet
        now = time.monotonic()
        if value > 0 and first is None:
            first = now
        if value == target or (value >= target and not exact):
            return first if first is not None else now, now
        time.sleep(0.05)
    raise ScenarioError(f"{scenario.name}: {name} reached {value:,.0f} of {target:,}")


def _redelivered_originals(scenario: Scenario) -> tuple[int, int]:
    """(copies in the redelivery topic, distinct original messages among them)."""
    queue = scenario.queue
    partitions = queue.dlq_partitions  # the redelivery topic's
    consumer = assigned_reader(
        scenario.settings, queue.redelivery_topic, dict.fromkeys(range(partitions), 0)
    )
    originals: set[tuple[bytes | None, bytes | None]] = set()
    copies = 0
    try:
        for batch in read_to_end(consumer, range(partitions), timeout_s=120, batch=10_000):
            for record in batch:
                headers = normalize_headers(record.headers())
                partition = header_value(headers, ORIGINAL_PARTITION)
                originals.add((partition, header_value(headers, ORIGINAL_OFFSET)))
                copies += 1
    finally:
        consumer.close()
    return copies, len(originals)
