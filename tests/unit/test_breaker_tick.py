"""The breaker sensor's decisions without Dagster, a broker or a store: what it remembers
between ticks, the window it judges, and what a tick says."""

from __future__ import annotations

import json

from kmq_dagster.core.breaker import BreakerConfig, Sample, State, judge_samples
from kmq_dagster.core.breaker_tick import SAID_TRANSITIONS, SensorMemory, quiet_tick, tick_lines

WINDOW_MS = 30_000


def totals(at_ms: int, consumed: int, failures: int = 0, inflight: int = 0) -> dict[str, int]:
    return {
        "at_ms": at_ms,
        "produced": 1_000,
        "consumed": consumed,
        "inflight": inflight,
        "failures": failures,
    }


def ticked(memory: SensorMemory, at_ms: int, consumed: int, **more: int) -> list[Sample]:
    """One tick: the memory goes through the cursor, as between two sensor evaluations."""
    again = SensorMemory.from_cursor(memory.to_cursor())
    samples = again.add_measurement(
        totals(at_ms, consumed, **more), at_ms=at_ms, window_ms=WINDOW_MS
    )
    memory.__dict__.update(again.__dict__)
    return samples


def test_the_first_tick_only_sets_the_baseline_and_later_ones_add_what_the_group_did() -> None:
    memory = SensorMemory.from_cursor(None)
    assert ticked(memory, 0, consumed=500, failures=7) == []
    assert ticked(memory, 10_000, consumed=540, failures=9) == [Sample(10_000, 40, 2)]
    assert ticked(memory, 20_000, consumed=600, failures=9) == [
        Sample(10_000, 40, 2),
        Sample(20_000, 60, 0),
    ]


def test_samples_older_than_two_windows_are_forgotten() -> None:
    memory = SensorMemory.from_cursor(None)
    ticked(memory, 0, consumed=0)
    ticked(memory, 1_000, consumed=10)
    samples = ticked(memory, 1_000 + 2 * WINDOW_MS, consumed=20)
    assert samples == [Sample(1_000 + 2 * WINDOW_MS, 10, 0)]


def test_failures_of_a_batch_still_in_flight_count_once_its_messages_finish() -> None:
    # a Spark batch writes its retry copies while its messages are in flight, uncommitted
    memory = SensorMemory.from_cursor(None)
    ticked(memory, 0, consumed=0)
    during = ticked(memory, 5_000, consumed=0, inflight=100, failures=30)
    after = ticked(memory, 10_000, consumed=100, inflight=0, failures=30)
    assert sum(s.failures for s in during) == 0
    assert sum(s.failures for s in after) == 30 and sum(s.processed for s in after) == 100


def test_a_flood_the_memory_collected_opens_the_breaker_and_a_quiet_group_does_not() -> None:
    config = BreakerConfig(window_ms=WINDOW_MS)
    flood, quiet = SensorMemory.from_cursor(None), SensorMemory.from_cursor(None)
    for memory, failures in ((flood, 90), (quiet, 1)):
        ticked(memory, 0, consumed=0)
        samples = ticked(memory, 10_000, consumed=100, failures=failures)
        moved = judge_samples(
            State.CLOSED, opened_at_ms=0, cooldown_ms=config.cooldown_ms, samples=samples,
            now_ms=10_000, config=config,
        )  # fmt: skip
        assert (moved is not None and moved.to_state is State.OPEN) == (memory is flood)


def test_a_cursor_of_an_earlier_sensor_keeps_the_transitions_it_reported() -> None:
    earlier = json.dumps({"alerts": {"last_transition_id": 41}})
    assert SensorMemory.from_cursor(earlier).last_transition_id == 41
    memory = SensorMemory.from_cursor(earlier)
    memory.last_transition_id = 45
    assert SensorMemory.from_cursor(memory.to_cursor()).last_transition_id == 45


def test_a_tick_names_its_last_transitions_and_counts_the_earlier_ones() -> None:
    lines = [f"breaker moved {i}" for i in range(SAID_TRANSITIONS + 4)]
    assert tick_lines(lines, "quiet") == ["4 earlier transitions", *lines[-SAID_TRANSITIONS:]]
    assert tick_lines(lines[:2], "quiet") == lines[:2]
    assert tick_lines([], "breaker closed; nothing to do") == ["breaker closed; nothing to do"]


def test_a_quiet_tick_counts_only_the_window_the_breaker_judges() -> None:
    config = BreakerConfig(window_ms=WINDOW_MS)
    now = 100_000
    samples = [Sample(now - WINDOW_MS - 1, 1_000, 900), Sample(now - 1_000, 40, 1)]
    said = quiet_tick(State.CLOSED, samples, config, now, opened_at_ms=None, cooldown_ms=None)
    assert "40 messages" in said and "900" not in said, said
