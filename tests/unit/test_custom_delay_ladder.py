"""Delay ladders of chosen levels: checked in one place, read back from the level topics, and
never delivering a message before its due time, whatever the levels."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.delay import (
    DEFAULT_DELAY_LEVELS_MS,
    HOP_LEAD_MS,
    MAX_DELAY_LEVELS,
    MAX_DELAY_MS,
    MIN_DELAY_MS,
    Deliver,
    Hold,
    Hop,
    check_delay_levels,
    enqueue,
    found_ladder,
    ladder_to_provision,
    level_for,
    next_step,
    parse_delay_levels,
)
from kmq_dagster.core.naming import delay_levels_of, delay_topics
from kmq_dagster.core.queue import Queue, topic_configs
from kmq_dagster.errors import ConfigError, ProvisionError
from kmq_dagster.kafka.provision_plan import queue_footprint

T0 = 1_700_000_000_000
S, M, H = 1_000, 60_000, 3_600_000
#: The ladder of the issue's example: 1s,30s,5m,1h.
CUSTOM = (1 * S, 30 * S, 5 * M, 1 * H)


def deliver_time(delay_ms: int, levels_ms: tuple[int, ...], lags_ms: list[int]) -> tuple[int, int]:
    """Walk one message down ``levels_ms`` as a forwarder would; returns (delivered at, hops).

    The forwarder takes a message ``HOP_LEAD_MS`` before its hop time, late by the next lag.
    """
    due_ms = T0 + delay_ms
    step: Deliver | Hold | Hop = enqueue(due_ms, T0, levels_ms)
    now_ms = T0
    hops = 0
    while isinstance(step, Hop):
        assert step.level_ms in levels_ms, "a hop to a level the ladder does not have"
        hops += 1
        assert hops <= hop_bound(delay_ms, levels_ms), "the ladder must converge"
        lag_ms = lags_ms[hops % len(lags_ms)] if lags_ms else 0
        now_ms = max(now_ms, step.hop_due_ms - HOP_LEAD_MS) + lag_ms
        step = next_step(due_ms, now_ms, levels_ms)
    if isinstance(step, Hold):
        return step.until_ms, hops
    return now_ms, hops


def hop_bound(delay_ms: int, levels_ms: tuple[int, ...]) -> int:
    """Most hops a delay takes: top-level rounds, then at most one level's worth of each
    smaller level's steps (each hop is taken ``HOP_LEAD_MS`` early, so it covers that less)."""
    pairs = itertools.pairwise(levels_ms)
    steps = sum(-(-upper // (lower - HOP_LEAD_MS)) for lower, upper in pairs)
    return delay_ms // (levels_ms[-1] - HOP_LEAD_MS) + steps + 2


def _ladder(first_ms: int, ratios: list[float]) -> tuple[int, ...]:
    levels_ms = [first_ms]
    for ratio in ratios:
        levels_ms.append(min(MAX_DELAY_MS, max(levels_ms[-1] + 1, round(levels_ms[-1] * ratio))))
    return check_delay_levels(sorted(set(levels_ms)))


#: Ladders of 1 to 16 levels, each at most 200 times the one below (so a walk stays short).
ladders = st.builds(
    _ladder,
    st.integers(MIN_DELAY_MS, 86_400_000),
    st.lists(st.floats(1.0, 200.0), max_size=MAX_DELAY_LEVELS - 1),
)


# -- the level choice ------------------------------------------------------------------------


@given(
    levels_ms=ladders,
    delay_fraction=st.floats(0, 1),
    lags_ms=st.lists(st.integers(0, 5_000), max_size=8),
)
def test_no_ladder_delivers_a_message_before_its_due_time(
    levels_ms: tuple[int, ...], delay_fraction: float, lags_ms: list[int]
) -> None:
    # any delay up to 40 top-level hops (longer ones only loop at the top more often)
    longest_ms = min(MAX_DELAY_MS, 40 * levels_ms[-1])
    delay_ms = MIN_DELAY_MS + round(delay_fraction * (longest_ms - MIN_DELAY_MS))

    delivered_ms, _hops = deliver_time(delay_ms, levels_ms, lags_ms)

    assert delivered_ms >= T0 + delay_ms


@given(levels_ms=ladders, delay_fraction=st.floats(0, 1))
def test_a_prompt_forwarder_delivers_on_time_or_after_the_smallest_level(
    levels_ms: tuple[int, ...], delay_fraction: float
) -> None:
    longest_ms = min(MAX_DELAY_MS, 40 * levels_ms[-1])
    delay_ms = MIN_DELAY_MS + round(delay_fraction * (longest_ms - MIN_DELAY_MS))

    delivered_ms, _ = deliver_time(delay_ms, levels_ms, lags_ms=[])

    if delay_ms >= levels_ms[0]:
        assert delivered_ms == T0 + delay_ms
    else:  # shorter than the smallest level: one hop of it, taken HOP_LEAD_MS early
        assert T0 + delay_ms <= delivered_ms <= T0 + levels_ms[0]


@given(delay_ms=st.integers(MIN_DELAY_MS, MAX_DELAY_MS))
def test_every_legal_delay_on_the_example_ladder_is_on_time(delay_ms: int) -> None:
    delivered_ms, hops = deliver_time(delay_ms, CUSTOM, lags_ms=[])

    assert delivered_ms == T0 + delay_ms
    assert hops <= 7 * 24 + 12 + 10 + 40  # hours, then 5m, 30s and 1s steps


@pytest.mark.parametrize(
    ("remaining_ms", "level_ms"),
    [
        (1 * S, 1 * S),
        (30 * S - 1, 1 * S),
        (30 * S, 30 * S),
        (5 * M - 1, 30 * S),
        (59 * M, 5 * M),
        (1 * H, 1 * H),
        (MAX_DELAY_MS, 1 * H),
    ],
)
def test_the_level_is_the_largest_of_the_chosen_ones_that_fits(
    remaining_ms: int, level_ms: int
) -> None:
    assert level_for(remaining_ms, CUSTOM) == level_ms


def test_a_delay_longer_than_the_largest_level_loops_at_the_top_and_is_not_early() -> None:
    # given a ladder whose largest level is 5m and a delay of 17m
    levels_ms = (30 * S, 5 * M)
    due_ms = T0 + 17 * M

    # when the forwarder takes the message at each hop time
    first = enqueue(due_ms, T0, levels_ms)
    second = next_step(due_ms, first.hop_due_ms, levels_ms)
    third = next_step(due_ms, T0 + 10 * M, levels_ms)
    fourth = next_step(due_ms, T0 + 15 * M, levels_ms)

    # then it goes round the 5m level until less than 5m is left, then 30s steps, no delivery
    assert first == Hop(5 * M, T0 + 5 * M)
    assert second == Hop(5 * M, T0 + 10 * M)
    assert third == Hop(5 * M, T0 + 15 * M)
    assert fourth == Hop(30 * S, T0 + 15 * M + 30 * S)
    assert deliver_time(17 * M, levels_ms, lags_ms=[]) == (due_ms, 3 + 4)


def test_a_delay_shorter_than_the_smallest_level_waits_that_level_and_is_not_early() -> None:
    # given a ladder whose smallest level is 30s, and a delay of 5s
    levels_ms = (30 * S, 5 * M)

    # when it is sent: it goes to the 30s level
    assert enqueue(T0 + 5 * S, T0, levels_ms) == Hop(30 * S, T0 + 30 * S)
    # and a forwarder taking it at its hop time delivers it then: 25 s late, never early
    assert next_step(T0 + 5 * S, T0 + 30 * S - HOP_LEAD_MS, levels_ms) == Deliver()
    # and a remainder below the smallest level is held in memory until exactly its due time
    assert next_step(T0 + 40 * S, T0 + 20 * S, levels_ms) == Hold(T0 + 40 * S)


# -- checking the levels ---------------------------------------------------------------------


def test_levels_are_sorted_into_a_ladder() -> None:
    assert check_delay_levels([5 * M, 1 * S, 1 * H, 30 * S]) == CUSTOM
    assert parse_delay_levels(" 1h, 1s,30s ,5m") == CUSTOM
    assert parse_delay_levels("1s,5s,30s,2m,10m,1h,6h,1d") == DEFAULT_DELAY_LEVELS_MS
    assert parse_delay_levels("7d") == (MAX_DELAY_MS,)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "comma-separated list of durations"),
        ("1s,30s,1s", "a level is given twice"),
        ("30s,0.5m", "not a duration"),
        ("1s,,5m", "comma-separated list of durations"),
        ("500ms,1m", "between 1s and 7d"),
        ("0s", "between 1s and 7d"),
        ("1m,8d", "between 1s and 7d"),
        (",".join(f"{n}s" for n in range(1, MAX_DELAY_LEVELS + 2)), "at most 16 levels"),
        ("soon", "not a duration"),
    ],
)
def test_bad_levels_are_one_clear_line(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        parse_delay_levels(text)

    assert "\n" not in str(raised.value)
    assert raised.value.setting == "delay_levels"


def test_no_levels_are_refused() -> None:
    with pytest.raises(ConfigError, match="give at least one level"):
        check_delay_levels([])


def test_sixteen_levels_are_accepted() -> None:
    levels_ms = [n * S for n in range(1, MAX_DELAY_LEVELS + 1)]

    assert check_delay_levels(levels_ms) == tuple(levels_ms)


@pytest.mark.parametrize("levels_ms", [[0], [-1_000], [999], [MAX_DELAY_MS + 1]])
def test_levels_outside_one_second_to_a_week_are_refused(levels_ms: list[int]) -> None:
    with pytest.raises(ConfigError, match="between 1s and 7d"):
        check_delay_levels(levels_ms)


# -- the ladder read back from the cluster's topics --------------------------------------------


def test_the_ladder_is_read_back_from_the_level_topics_provisioning_created() -> None:
    names = {
        *delay_topics("orders", CUSTOM),  # the ladder and orders.delay.dlq
        "orders",
        "orders.billing.retry.10s",
        "orders.delay.later",  # not a duration
        "orders.delay.60s",  # not written as kmq writes 1m
        "orders.delay.5m.x",
        "orders.delayed.2m",
        "shop.delay.2m",
    }

    assert delay_levels_of("orders", names) == CUSTOM
    assert found_ladder("orders", names) == CUSTOM


def test_a_topic_without_level_topics_or_delay_dlq_has_no_delay_queue() -> None:
    with pytest.raises(ProvisionError, match=r"orders has no delay queue \(no level topic"):
        found_ladder("orders", {"orders", "orders.delay.dlq"})
    with pytest.raises(ProvisionError, match=r"orders\.delay\.dlq missing"):
        found_ladder("orders", {"orders", "orders.delay.30s"})


def test_provisioning_keeps_an_existing_ladder_and_refuses_to_change_it() -> None:
    existing = {"orders", *delay_topics("orders", CUSTOM)}

    # no ladder yet: the chosen levels, else the default ones
    assert ladder_to_provision("orders", {"orders"}, [1 * H, 30 * S]) == (30 * S, 1 * H)
    assert ladder_to_provision("orders", {"orders"}, None) == DEFAULT_DELAY_LEVELS_MS
    # a ladder exists: kept when no levels or the same levels are given
    assert ladder_to_provision("orders", existing, None) == CUSTOM
    assert ladder_to_provision("orders", existing, reversed(CUSTOM)) == CUSTOM
    # other levels are refused, naming both ladders and the way out
    with pytest.raises(ProvisionError, match=r"levels 1s,30s,5m,1h, not 1s,30s,5m;") as raised:
        ladder_to_provision("orders", existing, CUSTOM[:3])
    assert "kmq does not change a delay ladder" in str(raised.value)
    with pytest.raises(ConfigError, match="given twice"):
        ladder_to_provision("orders", {"orders"}, [1 * S, 1 * S])


def test_the_footprint_of_a_queue_counts_the_level_topics_it_has() -> None:
    # given a queue whose delay queue has the levels 2s and 5m, and a stray topic
    queue = Queue("orders", "g", partitions=2)
    names = ["orders", "orders.delay.2s", "orders.delay.5m", "orders.delay.dlq", "orders.g.dlq"]
    existing = {**dict.fromkeys(names, 2), "orders.delay.soon": 2, "orders.delay.1s.x": 2}

    footprint = queue_footprint(queue, existing)

    # then it counts its own topics, those two levels among them, and nothing else
    assert set(footprint.topics) == set(names)
    assert footprint.partitions == 2 * len(names)


def test_a_level_topic_keeps_its_messages_at_least_twice_its_level_and_a_week() -> None:
    # a message waits up to its level on a level topic (longer while no forwarder runs):
    # retention must not delete it first, however long the chosen level
    configs = topic_configs(None, "orders", (1 * S, 5 * 86_400_000, MAX_DELAY_MS))

    assert configs["orders.delay.1s"] == {"retention.ms": str(MAX_DELAY_MS)}
    assert configs["orders.delay.5d"] == {"retention.ms": str(10 * 86_400_000)}
    assert configs["orders.delay.7d"] == {"retention.ms": str(2 * MAX_DELAY_MS)}
    assert configs["orders.delay.dlq"] == {"retention.ms": "-1"}
