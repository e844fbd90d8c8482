"""Broker faults under a running queue: a crash of the durable broker, and a stall.

* **crash**: ``kmq broker --data-dir`` is SIGKILLed mid-stream (its Tansu and SeaweedFS die
  with it) and started again on the same port and data dir after ``down_s``; the workers, the
  tracker and the delayer are the same processes before and after.
* **stall**: the process serving Kafka is SIGSTOPped for ``stall_s`` and then SIGCONTinued,
  under workers with the circuit breaker on. A stalled broker is no handler failure: no retry
  copy or dead letter may come of it, and the breaker must not move.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.bench.common import Report
from kmq_dagster.bench.fault_setup import Scenario, ScenarioError, Workload, progress_reporter
from kmq_dagster.bench.fleet import KmqProcess
from kmq_dagster.bench.tally import lines_of, topic_values
from kmq_dagster.broker.ports import port_is_free

#: Share of the messages processed before the fault is injected ("mid-stream").
FAULT_AT_SHARE = 0.25


def crash_workload(messages: int) -> Workload:
    return Workload(
        messages=messages, delayed_share=0.1, poison_share=0.01, failure_rate=0.02, work_ms=0.5
    )


def stall_workload(messages: int) -> Workload:
    return Workload(messages=messages, delayed_share=0.1, failure_rate=0.02, work_ms=0.5)


def start_services(scenario: Scenario, workers: int, *worker_args: str) -> list[KmqProcess]:
    services = [scenario.tracker(), scenario.delayer()]
    services += [scenario.worker(*worker_args) for _ in range(workers)]
    return services


def broker_crash(
    report: Report, *, messages: int = 20_000, down_s: float = 5.0, timeout_s: float = 600
) -> dict[str, Any]:
    """SIGKILL the durable broker mid-stream, restart it after ``down_s``; returns figures."""
    with Scenario("crash", crash_workload(messages), report, durable=True) as scenario:
        ledger = scenario.send()
        began = time.monotonic()
        services = start_services(scenario, 2)
        scenario.wait_for_progress(FAULT_AT_SHARE, timeout_s)
        broker = scenario.broker
        report(f"crash: SIGKILL kmq broker (pid {broker.process.pid if broker.process else 0})")
        broker.sigkill()
        deadline = time.monotonic() + 10
        while not port_is_free(broker.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not port_is_free(broker.port):
            raise ScenarioError("crash: the broker's children outlived it and hold its port")
        time.sleep(down_s)
        broker.start()
        report(f"crash: broker back on port {broker.port} after {down_s:g} s")
        ledger.wait_until_accounted(timeout_s, progress_reporter(report, "crash"))
        seconds = time.monotonic() - began
        scenario.require_alive(services)
        figures = ledger.outcome(seconds).figures()
        figures["down_s"] = down_s
        return figures


def broker_stall(
    report: Report, *, messages: int = 20_000, stall_s: float = 30.0, timeout_s: float = 600
) -> dict[str, Any]:
    """SIGSTOP the broker for ``stall_s`` under breaker-enabled workers; returns figures."""
    with Scenario("stall", stall_workload(messages), report) as scenario:
        ledger = scenario.send()
        began = time.monotonic()
        services = start_services(scenario, 2, "--breaker")
        scenario.wait_for_progress(FAULT_AT_SHARE, timeout_s)
        serving = scenario.broker.serving_pid()
        report(f"stall: SIGSTOP the broker (pid {serving}) for {stall_s:g} s")
        os.kill(serving, signal.SIGSTOP)
        try:
            time.sleep(stall_s)
        finally:
            os.kill(serving, signal.SIGCONT)
        report("stall: SIGCONT")
        ledger.wait_until_accounted(timeout_s, progress_reporter(report, "stall"))
        seconds = time.monotonic() - began
        scenario.require_alive(services)
        figures = ledger.outcome(seconds).figures()
        figures.update(_spent_on_broker_errors(scenario))
        figures["stall_s"] = stall_s
        return figures


def _spent_on_broker_errors(scenario: Scenario) -> dict[str, int]:
    """Retry copies and dead letters beyond the handler's own failures, redeliveries, and the
    breaker's transitions (its state moves only on handler outcomes)."""
    queue, settings = scenario.queue, scenario.settings
    partitions = queue.dlq_partitions  # of the retry, redelivery and dead-letter topics
    copies = sum(
        len(topic_values(settings, topic, partitions)) for topic in queue.retry_topics.values()
    )
    dead = len(topic_values(settings, queue.dlq_topic, partitions))
    failures = sum(lines_of(scenario.dir / "out", "failed").values())
    store = AuditStore(scenario.audit_url)
    try:
        transitions = len(store.transitions(queue.topic, queue.group))
    finally:
        store.close()
    return {
        "handler_failures": failures,
        "retried_or_dead_lettered": copies + dead,
        "spent_on_broker_errors": max(0, copies + dead - failures),
        "redelivered": len(topic_values(settings, queue.redelivery_topic, partitions)),
        "breaker_transitions": transitions,
    }
