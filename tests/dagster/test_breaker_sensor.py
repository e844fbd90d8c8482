"""The breaker sensor on the real broker and audit store: a handler failure flood opens the
group's breaker, alerts a real webhook and throttles the backlog sensor; after the cooldown it
probes, and processing without failures closes it with a resolve alert. Each transition reaches
the Dagster instance as a check evaluation and an observation carrying the reason and a
timestamp, and every tick's message says what the sensor saw."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    AssetObservation,
    DagsterInstance,
)
from dagster._core.definitions.metadata.metadata_value import (
    TextMetadataValue,
    TimestampMetadataValue,
)

from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.core.queue import Queue
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.worker.worker import Worker
from tests.dagster.helpers import QueueUnderTest, declare, produce_orders
from tests.dagster.receivers import http_receiver
from tests.kafka_helpers import wait_for

pytestmark = pytest.mark.kafka

CONFIG = BreakerConfig(window_ms=60_000, min_calls=10, error_rate=0.5, cooldown_ms=1_000, probes=3)


class DownstreamError(RuntimeError):
    pass


@contextmanager
def worker(kmq: KmqResource, queue: Queue, handler: Callable[[KmqMessage], None]) -> Iterator[Any]:
    running = Worker(kmq.open_queue(queue), handler)
    stop = threading.Event()
    stats: list[Any] = []
    thread = threading.Thread(target=lambda: stats.append(running.run(stop, stats.append)))
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join(60)


def fail(_message: KmqMessage) -> None:
    raise DownstreamError("payment service unavailable")


def handled(stats: list[Any]) -> int:
    return stats[-1].handled if stats else 0


def failed(stats: list[Any]) -> int:
    return stats[-1].failed if stats else 0


def breaker_state(q: QueueUnderTest, audit: AuditStoreResource) -> str:
    row = audit.get_store().breaker_state(q.spec.queue.topic, q.spec.queue.group)
    return row.state if row is not None else "closed"


def report(instance: DagsterInstance, result: Any) -> None:
    """Store a tick's asset events as the sensor daemon does."""
    for event in result.asset_events:
        instance.report_runless_asset_event(event)


def message(result: Any) -> str:
    return str(result.skip_reason.skip_message)


def test_a_failure_flood_opens_alerts_throttles_and_recovery_resolves(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource,
) -> None:  # fmt: skip
    q = declare(topic_name, tmp_path, instance, kmq, audit, breaker=CONFIG)
    with http_receiver() as hook:
        q.resources["alerts"] = KmqAlertsResource(webhook_url=hook.url, min_period_s=300)
        quiet = q.tick("breaker")
        assert message(quiet) == (
            "breaker closed, error rate 0% over 0 messages in the last 1m; nothing to do"
        )
        cursor = quiet.cursor
        # when: every message fails (the downstream service is down)
        produce_orders(kmq, topic_name, range(0, 40, 2))  # 20 orders, none poison
        with worker(kmq, q.spec.queue, fail) as stats:
            assert wait_for(lambda: failed(stats) >= 20, timeout_s=60)
        opened = q.tick("breaker", cursor)
        cursor = opened.cursor

        # then: the breaker is open, Dagster shows it, the webhook got one alert
        assert breaker_state(q, audit) == "open"
        (evaluation,) = [e for e in opened.asset_events if isinstance(e, AssetCheckEvaluation)]
        assert (evaluation.check_name, evaluation.passed) == ("breaker_closed", False)
        assert evaluation.severity == AssetCheckSeverity.ERROR
        assert "error rate 100% over 20 messages" in str(evaluation.description)
        assert message(opened).startswith("breaker opened: error rate 100% over 20 messages")
        assert message(opened).endswith("; alert sent: circuit breaker open")
        report(instance, opened)
        key = q.spec.queue_asset_key
        stored = instance.get_latest_asset_check_evaluation_record(
            AssetCheckKey(key, "breaker_closed")
        )
        assert stored is not None and stored.event is not None
        check = stored.event.asset_check_evaluation
        assert check is not None and not check.passed
        assert isinstance(check.metadata["changed_at"], TimestampMetadataValue)
        assert check.metadata["reason"] == TextMetadataValue(
            str(evaluation.description).removeprefix("circuit breaker ")
        )
        assert check.metadata["error_rate"] == TextMetadataValue("100%")
        (observed,) = instance.fetch_observations(key, limit=5).records
        observation = observed.asset_observation
        assert observation is not None
        assert observation.metadata["breaker_state"] == TextMetadataValue("open")
        changed_at = observation.metadata["changed_at"]
        assert isinstance(changed_at, TimestampMetadataValue)
        assert changed_at.value > 1.7e9  # seconds since the epoch, not milliseconds
        (alert,) = hook.bodies()
        assert (alert["kind"], alert["severity"]) == ("breaker_open", "critical")
        produce_orders(kmq, topic_name, range(40, 80, 2))
        throttled = q.tick("backlog").skip_reason.skip_message
        assert str(throttled).startswith(f"throttled: the circuit breaker of {q.spec.queue}")

        # when: the cooldown passes, the sensor probes; the service is back
        ticks: list[Any] = []

        def ticked_to(state: str) -> bool:
            """One more tick of the breaker sensor (resuming at the last cursor); whether the
            breaker is now ``state``."""
            nonlocal cursor
            ticks.append(q.tick("breaker", cursor))
            cursor = ticks[-1].cursor
            return breaker_state(q, audit) == state

        assert wait_for(lambda: ticked_to("half_open"), timeout_s=30, interval_s=0.5)
        assert message(ticks[-1]) == "breaker probing: cooldown over: probing (breaker sensor)"
        assert all(message(t).startswith("breaker open since ") for t in ticks[:-1])
        with worker(kmq, q.spec.queue, lambda message: None) as stats:
            assert wait_for(lambda: handled(stats) >= 20, timeout_s=60)

        # then: it closes, and the webhook gets the resolve (the half-open step folded in)
        assert wait_for(lambda: ticked_to("closed"), timeout_s=30, interval_s=0.5)
        assert re.fullmatch(
            r"breaker closed after \d+s: 20 of 20 messages processed while probing "
            r"\(breaker sensor\); alert sent: resolved: circuit breaker closed",
            message(ticks[-1]),
        ), message(ticks[-1])
        closing = [e for e in ticks[-1].asset_events if isinstance(e, AssetObservation)]
        assert [o.metadata["transition"] for o in closing] == [
            TextMetadataValue("half-open -> closed")
        ]
        assert [b["kind"] for b in hook.bodies()] == ["breaker_open", "breaker_closed"]
        assert hook.bodies()[-1]["title"] == "resolved: circuit breaker closed"
        assert hook.bodies()[-1]["text"].startswith("half-open -> closed: ")  # one spelling
        states = [t.to_state for t in audit.get_store().transitions(topic_name, q.spec.queue.group)]
        assert states == ["open", "half_open", "closed"]
