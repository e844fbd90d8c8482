"""The metrics collector turns a service's snapshot into Prometheus families (no server)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kmq_dagster.metrics import ServiceMetrics, Snapshot


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
