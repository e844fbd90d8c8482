"""The delay ladder: any delay reaches the queue topic at its due time, never before."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.delay import (
    DEFAULT_DELAY_LEVELS_MS,
    HOP_DUE_MS,
    HOP_LEAD_MS,
    MAX_DELAY_MS,
    MIN_DELAY_MS,
    Deliver,
    Hold,
    Hop,
    check_delay_ms,
    delay_headers,
    enqueue,
    level_for,
    next_step,
    read_delay_times,
)
from kmq_dagster.core.naming import delay_topics
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.errors import ConfigError
from tests.unit.test_custom_delay_ladder import deliver_time as walk_ladder

T0 = 1_700_000_000_000
LADDER = DEFAULT_DELAY_LEVELS_MS


def deliver_time(delay_ms: int, lags_ms: list[int]) -> tuple[int, int]:
    """Walk one message down the default ladder as a forwarder would (see
    :func:`~tests.unit.test_custom_delay_ladder.deliver_time`): (delivered at, hops)."""
    return walk_ladder(delay_ms, LADDER, lags_ms)


@given(
    delay_ms=st.integers(MIN_DELAY_MS, MAX_DELAY_MS),
    lags_ms=st.lists(st.integers(0, 5_000), max_size=8),
)
def test_a_delayed_message_is_never_delivered_early(delay_ms: int, lags_ms: list[int]) -> None:
    delivered_ms, _hops = deliver_time(delay_ms, lags_ms)

    assert delivered_ms >= T0 + delay_ms


@given(delay_ms=st.integers(MIN_DELAY_MS, MAX_DELAY_MS))
def test_a_prompt_forwarder_delivers_exactly_on_time(delay_ms: int) -> None:
    delivered_ms, hops = deliver_time(delay_ms, lags_ms=[])

    assert delivered_ms == T0 + delay_ms
    assert hops <= 40


@given(
    delay_ms=st.integers(MIN_DELAY_MS, MAX_DELAY_MS),
    lag_ms=st.integers(0, HOP_LEAD_MS),
)
def test_lag_within_the_lead_costs_nothing(delay_ms: int, lag_ms: int) -> None:
    delivered_ms, _ = deliver_time(delay_ms, [lag_ms])

    assert delivered_ms - (T0 + delay_ms) <= lag_ms


def test_a_week_takes_a_handful_of_hops_on_eight_topics() -> None:
    _, hops = deliver_time(MAX_DELAY_MS, [])

    assert len(DEFAULT_DELAY_LEVELS_MS) == 8
    assert hops <= 40
    assert delay_topics("orders", DEFAULT_DELAY_LEVELS_MS)[:3] == [
        "orders.delay.1s",
        "orders.delay.5s",
        "orders.delay.30s",
    ]
    assert delay_topics("orders", DEFAULT_DELAY_LEVELS_MS)[-1] == "orders.delay.dlq"


@pytest.mark.parametrize(
    ("remaining_ms", "level_ms"),
    [(1_000, 1_000), (4_999, 1_000), (5_000, 5_000), (90_000, 30_000), (10**10, 86_400_000)],
)
def test_level_is_the_largest_that_fits(remaining_ms: int, level_ms: int) -> None:
    assert level_for(remaining_ms, LADDER) == level_ms


@pytest.mark.parametrize("delay_ms", [0, 999, MAX_DELAY_MS + 1, -5])
def test_delays_outside_one_second_to_a_week_are_refused(delay_ms: int) -> None:
    with pytest.raises(ConfigError, match="delay must be between 1s and 7d"):
        check_delay_ms(delay_ms)


def test_delay_times_round_trip_through_headers() -> None:
    step = enqueue(T0 + 90_000, T0, LADDER)
    headers = [(k, v.encode()) for k, v in delay_headers(step, T0 + 90_000).items()]

    times = read_delay_times(headers, T0)

    assert (times.due_ms, times.hop_due_ms) == (T0 + 90_000, T0 + 30_000)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(DUE_MS, b"123")],
        [(DUE_MS, b"soon"), (HOP_DUE_MS, b"1")],
        [(DUE_MS, None), (HOP_DUE_MS, b"1")],
        [(DUE_MS, str(T0 + MAX_DELAY_MS * 3).encode()), (HOP_DUE_MS, b"1")],
    ],
)
def test_missing_garbage_or_far_future_delay_headers_are_reported(
    headers: list[tuple[str, bytes | None]],
) -> None:
    with pytest.raises(ValueError):
        read_delay_times(headers, T0)


@pytest.mark.parametrize("delay_ms", [MIN_DELAY_MS, MAX_DELAY_MS])
def test_delays_of_exactly_one_second_and_exactly_seven_days_are_accepted(delay_ms: int) -> None:
    assert check_delay_ms(delay_ms) == delay_ms
    assert (MIN_DELAY_MS, MAX_DELAY_MS) == (1_000, 7 * 86_400_000)


def test_a_message_taken_exactly_at_its_due_time_is_delivered() -> None:
    assert next_step(T0, now_ms=T0, levels_ms=LADDER) == Deliver()
    assert next_step(T0, now_ms=T0 + 1, levels_ms=LADDER) == Deliver()


def test_less_than_the_smallest_level_is_held_and_exactly_that_level_hops() -> None:
    assert next_step(T0 + 999, now_ms=T0, levels_ms=LADDER) == Hold(T0 + 999)
    assert next_step(T0 + 1_000, now_ms=T0, levels_ms=LADDER) == Hop(1_000, T0 + 1_000)


@pytest.mark.parametrize(
    ("remaining_ms", "level_ms"),
    [(86_400_000, 86_400_000), (86_399_999, 21_600_000), (21_600_000, 21_600_000)],
)
def test_the_last_levels_edge_belongs_to_the_last_level(remaining_ms: int, level_ms: int) -> None:
    assert enqueue(T0 + remaining_ms, T0, LADDER) == Hop(level_ms, T0 + level_ms)


def test_a_due_time_exactly_at_the_furthest_legal_distance_is_read_and_one_ms_more_is_not() -> None:
    # given the furthest a due time may lie ahead: the longest delay plus a day of clock slack
    furthest_ms = T0 + MAX_DELAY_MS + 86_400_000

    def headers(due_ms: int) -> list[tuple[str, bytes | None]]:
        return [(DUE_MS, str(due_ms).encode()), (HOP_DUE_MS, str(T0).encode())]

    # then exactly that distance is read, one millisecond more is corrupt
    assert read_delay_times(headers(furthest_ms), T0).due_ms == furthest_ms
    with pytest.raises(ValueError, match="ahead"):
        read_delay_times(headers(furthest_ms + 1), T0)
