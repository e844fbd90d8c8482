"""The metrics collector turns a service's snapshot into Prometheus families, and a worker's
counts into its snapshot (no server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.clients import ClientErrors
from kmq_dagster.kafka.retry_router import RouterStats
from kmq_dagster.metrics import ServiceMetrics, Snapshot, worker_snapshot
from kmq_dagster.worker.loop_types import WorkerStats


def exposition(snapshot: Snapshot) -> str:
    registry = CollectorRegistry()
    registry.register(ServiceMetrics("worker", "orders", "billing", lambda: snapshot))
    return generate_latest(registry).decode()


def test_counters_gauges_and_the_breaker_state_carry_the_queue_labels() -> None:
    text = exposition(
        Snapshot(
            acks=7,
            retries=2,
            dead_letters=1,
            in_flight=3,
            breaker_state="open",
            client_errors={"_TRANSPORT": 4},
        )
    )
    labels = 'group="billing",service="worker",topic="orders"'
    assert f"kmq_acks_total{{{labels}}} 7.0" in text
    assert f"kmq_retries_total{{{labels}}} 2.0" in text
    assert f"kmq_dead_letters_total{{{labels}}} 1.0" in text
    assert f"kmq_in_flight{{{labels}}} 3.0" in text
    # (the exposition sorts labels by name)
    queue = 'group="billing",service="worker"'
    assert f'kmq_breaker_state{{{queue},state="open",topic="orders"}} 1.0' in text
    assert f'kmq_breaker_state{{{queue},state="closed",topic="orders"}} 0.0' in text
    assert f'kmq_client_errors_total{{error="_TRANSPORT",{labels}}} 4.0' in text


def test_figures_a_service_does_not_have_are_left_out() -> None:
    text = exposition(Snapshot(delayed_delivered=5))
    assert "kmq_delayed_delivered_total" in text
    for absent in ("kmq_acks_total", "kmq_in_flight", "kmq_breaker_state", "kmq_oldest"):
        assert absent not in text


def test_a_concurrent_workers_calls_held_messages_and_waits_by_ordering_are_exposed() -> None:
    waits = WaitHistogram()
    for wait_s in (0.0, 0.02, 2.0):
        waits.observe(wait_s)
    text = exposition(
        Snapshot(calls_in_flight=8, held_messages=92, call_waits=waits, ordering="key")
    )
    labels = 'group="billing",service="worker",topic="orders"'
    assert f"kmq_calls_in_flight{{{labels}}} 8.0" in text
    assert f"kmq_held_messages{{{labels}}} 92.0" in text
    waited = 'group="billing",ordering="key",service="worker",topic="orders"'
    bucket = 'kmq_call_wait_seconds_bucket{group="billing",le="%s",ordering="key",service=' + (
        '"worker",topic="orders"}'
    )
    assert f"{bucket % '0.05'} 2.0" in text
    assert f"{bucket % '+Inf'} 3.0" in text
    assert f"kmq_call_wait_seconds_count{{{waited}}} 3.0" in text
    assert f"kmq_call_wait_seconds_sum{{{waited}}} 2.02" in text


def test_the_retries_a_worker_reports_include_its_retries_in_place() -> None:
    worker = SimpleNamespace(
        consumer=SimpleNamespace(
            stats=SimpleNamespace(acked=5, fetched=9, client_errors=ClientErrors())
        ),
        router=SimpleNamespace(stats=RouterStats(retried=2, dead_lettered=1)),
        stats=WorkerStats(handled=4, failed=6, retried_in_place=3, calls_in_flight=2, held=1),
        breaker=None,
        ordering=Ordering.KEY,
    )

    snapshot = worker_snapshot(worker)  # type: ignore[arg-type]

    assert snapshot.retries == 2 + 3
    assert (snapshot.calls_in_flight, snapshot.held_messages, snapshot.ordering) == (2, 1, "key")


def test_wait_buckets_are_cumulative_and_end_with_the_count() -> None:
    waits = WaitHistogram(bounds_s=(0.1, 1.0))
    for wait_s in (0.05, 0.1, 0.5, 7.0):
        waits.observe(wait_s)
    assert waits.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert waits.sum_s == pytest.approx(7.65)


def test_waits_observed_together_count_as_each_observed_alone() -> None:
    one_by_one, together = WaitHistogram(bounds_s=(0.1, 1.0)), WaitHistogram(bounds_s=(0.1, 1.0))
    waits_s = [0.05, 0.1, 0.5, 7.0, 1.0]
    for wait_s in waits_s:
        one_by_one.observe(wait_s)
    together.observe_all(waits_s)
    assert together.cumulative() == one_by_one.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert together.sum_s == pytest.approx(one_by_one.sum_s)
