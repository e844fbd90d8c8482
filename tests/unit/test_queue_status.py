"""QueueStatus decides work, run keys and rates from figures alone (pure)."""

from __future__ import annotations

from dataclasses import replace

from kmq_dagster.core.status import PartitionLag, QueueStatus, RetryHead, rates_between

NOW_MS = 1_800_000_000_000


def status(**changes: object) -> QueueStatus:
    base = QueueStatus(
        topic="orders",
        group="pricing",
        measured_at_ms=NOW_MS,
        lags=(PartitionLag("orders", 0, 100, 100), PartitionLag("orders", 1, 50, 50)),
        redelivery=(PartitionLag("orders.pricing.redelivery", 0, 0, 0),),
        retries=(PartitionLag("orders.pricing.retry.1s", 0, 7, 4),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_caught_up_queue_has_no_work() -> None:
    assert status().work == 0
    assert "lag 0 on 2 partitions" in status().describe_backlog()


def test_lag_and_redeliveries_are_work() -> None:
    # given: 30 new messages on partition 1 and 2 redelivered copies
    busy = status(
        lags=(PartitionLag("orders", 0, 100, 100), PartitionLag("orders", 1, 80, 50)),
        redelivery=(PartitionLag("orders.pricing.redelivery", 0, 2, 0),),
        retry_heads=(RetryHead("orders.pricing.retry.1s", 0, NOW_MS + 5_000),),
    )
    # then: both count, the retries not yet due do not
    assert busy.work == 32
    assert busy.due_retries == 0
    assert busy.next_retry_due_ms == NOW_MS + 5_000
    assert "3 retries not due yet" in busy.describe_backlog()


def test_retries_count_once_their_head_is_due() -> None:
    due = status(retry_heads=(RetryHead("orders.pricing.retry.1s", 0, NOW_MS),))
    assert due.due_retries == 3
    assert due.work == 3


def test_a_retry_without_a_due_time_is_work_at_once() -> None:
    # the consumer dead-letters it as corrupt metadata: that is work for a run
    assert status(retry_heads=(RetryHead("orders.pricing.retry.1s", 0, None),)).work == 3


def test_the_run_key_changes_with_offsets_and_the_breaker_and_only_with_them() -> None:
    first = status()
    later_same = replace(first, measured_at_ms=NOW_MS + 60_000, inflight=5)
    grown = status(lags=(PartitionLag("orders", 0, 101, 100), PartitionLag("orders", 1, 50, 50)))
    progressed = status(retries=(PartitionLag("orders.pricing.retry.1s", 0, 7, 5),))
    assert first.run_key() == later_same.run_key()
    assert len({first.run_key(), grown.run_key(), progressed.run_key()}) == 3


def test_oldest_unacked_age_is_measured_from_its_start() -> None:
    assert status().oldest_unacked_age_ms is None
    assert status(oldest_unacked_started_ms=NOW_MS - 4_000).oldest_unacked_age_ms == 4_000


def test_rates_count_produced_acknowledged_and_failed_messages() -> None:
    # given: 10 s ago 150 produced, 150 consumed, nothing in flight, 7 retry copies written
    earlier = status(measured_at_ms=NOW_MS - 10_000).totals()
    # when: 100 more were produced, 90 consumed of which 10 are still in flight, 3 failed
    later = status(
        lags=(PartitionLag("orders", 0, 200, 190), PartitionLag("orders", 1, 50, 50)),
        retries=(PartitionLag("orders.pricing.retry.1s", 0, 10, 4),),
        inflight=10,
    )
    rates = rates_between(earlier, later)
    # then
    assert rates.in_per_s == 10.0
    assert rates.processed == 80
    assert rates.failures == 3
    assert rates.ack_per_s == 7.7


def test_a_probe_after_a_run_the_breaker_stopped_gets_a_key_of_its_own() -> None:
    # given a run requested over some offsets, which the breaker opening stopped before it
    # moved any; when the breaker is half-open over the same offsets
    before = status(lags=(PartitionLag("orders", 0, 120, 100), PartitionLag("orders", 1, 50, 50)))
    probing = replace(before, breaker_state="half_open", breaker_opened_at_ms=NOW_MS)
    reopened = replace(probing, breaker_opened_at_ms=NOW_MS + 90_000)
    # then each is a different run request (the same key would be skipped by Dagster)
    assert len({before.run_key(), probing.run_key(), reopened.run_key()}) == 3
