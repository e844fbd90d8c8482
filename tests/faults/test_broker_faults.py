"""A crash and a stall of the broker under running workers, tracker and delayer (real
processes, CI sizes; `kmq bench faults` runs the full sizes)."""

from __future__ import annotations

import pytest

from kmq_dagster.bench.broker_faults import broker_crash, broker_stall

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_crash_of_the_durable_broker_loses_nothing_and_the_services_ride_through() -> None:
    # given 3,000 messages (some delayed, some poison) on a durable broker, 2 workers, a
    # tracker and a delayer; when kmq broker is SIGKILLed mid-stream and restarted 3 s later
    figures = broker_crash(print, messages=3_000, down_s=3.0, timeout_s=240)
    # then every message was processed or dead-lettered, by the same processes throughout
    # (broker_crash raises if one of them exited, or if the broker's children held its port)
    print(figures)
    assert figures["lost"] == 0
    # and every poison message was dead-lettered and none processed (any other message may
    # be both processed and dead-lettered: a lost acknowledgement redelivers it)
    assert figures["poison"] > 0
    assert figures["poison_dead_lettered"] == figures["poison"]
    assert figures["poison_processed"] == 0


def test_a_stalled_broker_spends_no_retries_or_dead_letters_and_leaves_the_breaker_alone() -> None:
    # given breaker-enabled workers whose handler fails 2% of calls; when the broker is
    # SIGSTOPped for 8 s (longer than the 6 s session timeout) and then SIGCONTinued
    figures = broker_stall(print, messages=3_000, stall_s=8.0, timeout_s=240)
    print(figures)
    # then nothing is lost, every retry copy and dead letter is a handler failure's, and the
    # circuit breaker never moved
    assert figures["lost"] == 0
    assert figures["spent_on_broker_errors"] == 0
    assert figures["retried_or_dead_lettered"] == figures["handler_failures"]
    assert figures["breaker_transitions"] == 0
