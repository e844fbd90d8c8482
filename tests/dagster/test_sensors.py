"""The backlog and observation sensors against the real broker and audit store (no Spark):
they skip with reasons a person understands, key runs by offsets, and record what they see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    MetadataValue,
)
from dagster._core.definitions.metadata.metadata_value import FloatMetadataValue
from dagster._core.test_utils import create_run_for_test
from sqlalchemy import select

from kmq_dagster.audit.models import QueueSnapshot
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer
from tests.dagster.helpers import QueueUnderTest, declare, produce_orders
from tests.kafka_helpers import produce_dead_letters, wait_for

pytestmark = pytest.mark.kafka


def checks_of(result: object) -> dict[str, AssetCheckEvaluation]:
    events = getattr(result, "asset_events", [])
    return {e.check_name: e for e in events if isinstance(e, AssetCheckEvaluation)}


def test_ticks_over_unchanged_offsets_request_the_same_run(
    topic_name: str, kmq: KmqResource, demo: QueueUnderTest
) -> None:
    assert "no backlog" in str(demo.tick("backlog").skip_reason.skip_message)

    produce_orders(kmq, topic_name, range(30))
    first, second = demo.tick("backlog"), demo.tick("backlog")

    assert len(first.run_requests) == len(second.run_requests) == 1
    assert first.run_requests[0].run_key == second.run_requests[0].run_key
    assert first.run_requests[0].tags["kmq/work"] == "30"
    produce_orders(kmq, topic_name, range(30, 31))
    assert demo.tick("backlog").run_requests[0].run_key != first.run_requests[0].run_key


def test_a_run_in_flight_makes_the_backlog_sensor_skip_naming_it(
    topic_name: str, instance: DagsterInstance, kmq: KmqResource, demo: QueueUnderTest
) -> None:
    produce_orders(kmq, topic_name, range(10))
    run = create_run_for_test(
        instance, job_name=demo.spec.job_name("process"), status=DagsterRunStatus.STARTED
    )

    result = demo.tick("backlog")

    assert result.run_requests == []
    assert result.skip_reason.skip_message == f"processing run {run.run_id} is in flight"


def test_an_open_breaker_throttles_the_backlog_sensor_and_fails_its_check(
    topic_name: str, kmq: KmqResource, audit: AuditStoreResource, demo: QueueUnderTest
) -> None:
    produce_orders(kmq, topic_name, range(10))
    opened_at_ms = 1_795_461_928_000
    assert audit.get_store().save_breaker_state(
        topic_name, demo.spec.queue.group, state="open", opened_at_ms=opened_at_ms,
        cooldown_ms=10_000, expected_version=None,
    )  # fmt: skip

    skipped = demo.tick("backlog")
    observed = demo.tick("observe")

    assert skipped.run_requests == []
    message = str(skipped.skip_reason.skip_message)
    assert message.startswith(f"throttled: the circuit breaker of {demo.spec.queue} is open")
    assert "since 2026-11-23 19:25:28 UTC" in message
    assert "lag 10 on 2 partitions" in message
    breaker = checks_of(observed)["breaker_closed"]
    assert not breaker.passed
    assert breaker.severity == AssetCheckSeverity.ERROR
    # a point in time is a timestamp Dagster shows as a time, not a number plotted near 1.8e12
    assert breaker.metadata["opened_at"] == MetadataValue.timestamp(opened_at_ms / 1000)
    assert "opened_at_ms" not in breaker.metadata
    said = str(observed.skip_reason.skip_message)
    assert said.startswith("observed lag 10 on 2 partitions")
    assert "; breaker open; failing: breaker_closed (circuit breaker open since 2026-11-23" in said


def test_one_dead_letter_passes_by_default_and_the_window_reads_as_a_duration(
    kmq: KmqResource, demo: QueueUnderTest
) -> None:
    # given the demo queue with its default dead-letter threshold (10 in the window)
    produce_dead_letters(kmq.get_settings(), demo.spec.queue, [("k1", "ValueError")])

    check = checks_of(demo.tick("observe"))["dead_letters_not_growing"]

    assert check.passed, check.description
    assert check.description == "1 new dead letter in the last 15m (at most 10 allowed)"
    assert check.metadata["window"] == MetadataValue.text("15m")
    assert "window_ms" not in check.metadata


def test_dead_letters_growing_warn_and_are_ingested_with_a_snapshot_per_tick(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource,
) -> None:  # fmt: skip
    q = declare(topic_name, tmp_path, instance, kmq, audit, dead_letter_threshold=2)
    first = q.tick("observe")
    assert checks_of(first)["dead_letters_not_growing"].passed

    produce_dead_letters(
        kmq.get_settings(), q.spec.queue, [(f"k{i}", "ValueError") for i in range(3)]
    )
    second = q.tick("observe", cursor=first.cursor)

    growing = checks_of(second)["dead_letters_not_growing"]
    assert not growing.passed
    assert growing.severity == AssetCheckSeverity.WARN
    assert str(growing.description).startswith("3 new dead letters in the last 15m")
    said = str(second.skip_reason.skip_message)
    assert "(oldest -)" in said and "in 0 /s, acked 0 /s" in said
    assert "3 new dead letters stored, 3 in the DLQ" in said
    assert "failing: dead_letters_not_growing (3 new dead letters" in said
    observation = next(e for e in second.asset_events if isinstance(e, AssetObservation))
    assert observation.metadata["dlq_depth"] == MetadataValue.int(3)
    assert observation.metadata["new_dead_letters"] == MetadataValue.int(3)
    assert isinstance(observation.metadata["ack_per_s"], FloatMetadataValue)
    assert audit.get_store().count_dead_letters() == 3
    with audit.get_store().session() as session:
        snapshots = list(session.scalars(select(QueueSnapshot).order_by(QueueSnapshot.id)))
    assert [s.queue_topic for s in snapshots] == [topic_name, topic_name]
    assert json.loads(second.cursor)["at_ms"] > json.loads(first.cursor)["at_ms"]


def test_a_message_unacknowledged_past_every_delivery_fails_the_age_check(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource,
) -> None:  # fmt: skip
    # given: a 4 s visibility timeout (room for a slow first tick on a loaded machine), no
    # redelivery allowed, and no tracker running
    q = declare(
        topic_name, tmp_path, instance, kmq, audit, visibility_timeout_ms=4_000, max_redeliveries=0
    )
    produce_orders(kmq, topic_name, range(4))
    consumer = KmqConsumer(kmq.open_queue(q.spec.queue))
    fetched: list[object] = []

    def fetched_all() -> bool:
        fetched.extend(consumer.poll(0.5))
        return len(fetched) >= 4

    started_ms = wall_clock_ms()  # before the start markers: no message is older than this
    assert wait_for(fetched_all)
    consumer.close()  # started, never acknowledged

    assert checks_of(q.tick("observe"))["oldest_unacked_age"].passed
    results: list[Any] = []

    def age_check_failed() -> bool:
        results.append(q.tick("observe"))
        return not checks_of(results[-1])["oldest_unacked_age"].passed

    assert wait_for(age_check_failed, timeout_s=30, interval_s=0.2)
    assert wall_clock_ms() - started_ms >= 4_000  # never before the limit
    result = results[-1]

    age = checks_of(result)["oldest_unacked_age"]
    assert not age.passed
    assert age.severity == AssetCheckSeverity.ERROR
    observation = next(e for e in result.asset_events if isinstance(e, AssetObservation))
    assert observation.metadata["in_flight"] == MetadataValue.int(4)
    age_s = observation.metadata["oldest_unacked_age_s"]
    assert isinstance(age_s, FloatMetadataValue)
    assert (age_s.value or 0.0) >= 4.0
