"""Retry policy: which retry topic, due when, and when to give up."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.durations import MAX_DURATION_MS
from kmq_dagster.core.retry import DeadLetter, Retry, RetryPolicy
from kmq_dagster.errors import ConfigError

MINUTE = 60_000


def test_explicit_sequence_gives_one_retry_per_delay_and_one_topic_per_distinct_delay() -> None:
    policy = RetryPolicy.fixed(
        [5 * MINUTE, 5 * MINUTE, 30 * MINUTE, 30 * MINUTE, 30 * MINUTE, 60 * MINUTE]
    )
    rng = random.Random(1)
    assert policy.attempts == 7
    assert policy.topic_delays_ms() == [5 * MINUTE, 30 * MINUTE, 60 * MINUTE]
    decisions = [policy.after_failure(n, "Timeout", 1_000, rng) for n in range(1, 8)]
    assert decisions[:6] == [
        Retry(2, 5 * MINUTE, 1_000 + 5 * MINUTE),
        Retry(3, 5 * MINUTE, 1_000 + 5 * MINUTE),
        Retry(4, 30 * MINUTE, 1_000 + 30 * MINUTE),
        Retry(5, 30 * MINUTE, 1_000 + 30 * MINUTE),
        Retry(6, 30 * MINUTE, 1_000 + 30 * MINUTE),
        Retry(7, 60 * MINUTE, 1_000 + 60 * MINUTE),
    ]
    assert decisions[6] == DeadLetter(7, "failed 7 attempts, the last with Timeout")


def test_exponential_backoff_is_capped() -> None:
    policy = RetryPolicy(initial_delay_ms=1_000, multiplier=3, max_delay_ms=20_000, max_attempts=6)
    assert [policy.nominal_delay_ms(n) for n in range(1, 6)] == [
        1_000,
        3_000,
        9_000,
        20_000,
        20_000,
    ]
    assert policy.topic_delays_ms() == [1_000, 3_000, 9_000, 20_000]


@pytest.mark.parametrize("error_type", ["ValueError", "UnicodeDecodeError", "JSONDecodeError"])
def test_non_retryable_and_deserialization_errors_go_straight_to_the_dlq(error_type: str) -> None:
    policy = RetryPolicy.fixed([1_000], non_retryable=["ValueError"])
    decision = policy.after_failure(1, error_type, 0, random.Random(0))
    assert decision == DeadLetter(1, f"non-retryable error {error_type}")


@given(
    st.integers(1, 10),
    st.floats(0, 0.99),
    st.integers(0, 10**13),
    st.integers(0, 2**32),
)
def test_jittered_due_time_stays_within_its_spread(
    attempt: int, jitter: float, failed_at_ms: int, seed: int
) -> None:
    policy = RetryPolicy(
        initial_delay_ms=500, multiplier=2, max_delay_ms=60_000, jitter=jitter, max_attempts=11
    )
    decision = policy.after_failure(attempt, "E", failed_at_ms, random.Random(seed))
    assert isinstance(decision, Retry)
    delay = policy.nominal_delay_ms(attempt)
    assert decision.topic_delay_ms == delay
    assert failed_at_ms + delay * (1 - jitter) - 1 <= decision.due_ms
    assert decision.due_ms <= failed_at_ms + delay * (1 + jitter) + 1
    assert decision.due_ms > failed_at_ms  # a retry is always later than the failure


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delays_ms": (0,)},
        {"delays_ms": (1_000, -1)},
        {"delays_ms": (MAX_DURATION_MS + 1,)},
        {"initial_delay_ms": 0},
        {"max_delay_ms": MAX_DURATION_MS + 1},
        {"multiplier": 0.5},
        {"multiplier": math.nan},
        {"multiplier": math.inf},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"jitter": math.nan},
        {"jitter": math.inf},
        {"max_attempts": 0},
        {"initial_delay_ms": 10, "max_delay_ms": 5},
    ],
)
def test_invalid_policies_are_config_errors_in_the_librarys_terms(
    kwargs: dict[str, object],
) -> None:
    with pytest.raises(ConfigError) as refused:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]

    assert "--" not in str(refused.value)  # no CLI flag: the library is used without the CLI


def test_a_backoff_spec_gives_its_retry_topics_and_bad_specs_are_clear_errors() -> None:
    policy = RetryPolicy.exponential("1s,2,3s", max_attempts=5, jitter=0.1)

    assert policy.topic_delays_ms() == [1_000, 2_000, 3_000]
    assert (policy.attempts, policy.jitter) == (5, 0.1)
    for spec in ("1s,2", "1s,x,3s", "5s,2,1s", "1s,0.5,3s", "1s,nan,10m", "1s,inf,10m", "0s,2,1s"):
        with pytest.raises(ConfigError, match="a backoff takes INITIAL,MULTIPLIER,MAX") as bad:
            RetryPolicy.exponential(spec, max_attempts=3)
        assert "--" not in str(bad.value)


def test_jitter_spreads_due_times_to_both_sides_of_the_nominal_delay() -> None:
    # given a 10 s delay with 50 % jitter and a seeded random source
    policy = RetryPolicy(initial_delay_ms=10_000, max_delay_ms=10_000, jitter=0.5, max_attempts=2)
    rng = random.Random(20)

    # when the first attempt fails a thousand times at t=0
    spreads_ms = []
    for _ in range(1_000):
        decision = policy.after_failure(1, "Timeout", 0, rng)
        assert isinstance(decision, Retry)
        spreads_ms.append(decision.due_ms - 10_000)

    # then due times reach almost 5 s early and almost 5 s late, never beyond
    assert -5_000 <= min(spreads_ms) < -4_500
    assert 4_500 < max(spreads_ms) <= 5_000
    assert sum(spread_ms < 0 for spread_ms in spreads_ms) > 400  # about half come early


def test_a_multiplier_of_exactly_one_retries_at_the_initial_delay_on_one_topic() -> None:
    policy = RetryPolicy(initial_delay_ms=2_000, multiplier=1, max_delay_ms=60_000, max_attempts=5)

    assert [policy.nominal_delay_ms(n) for n in range(1, 5)] == [2_000] * 4
    assert policy.topic_delays_ms() == [2_000]


def test_an_initial_delay_equal_to_the_maximum_retries_at_that_delay() -> None:
    policy = RetryPolicy(initial_delay_ms=5_000, max_delay_ms=5_000, max_attempts=3)

    assert policy.topic_delays_ms() == [5_000]


def test_one_attempt_in_all_dead_letters_the_first_failure() -> None:
    policy = RetryPolicy(max_attempts=1)

    decision = policy.after_failure(1, "Timeout", 0, random.Random(0))

    assert decision == DeadLetter(1, "failed 1 attempts, the last with Timeout")
    assert policy.topic_delays_ms() == []


def test_the_last_attempt_dead_letters_and_the_one_before_retries() -> None:
    policy = RetryPolicy(max_attempts=3)
    rng = random.Random(0)

    assert isinstance(policy.after_failure(2, "Timeout", 0, rng), Retry)
    assert isinstance(policy.after_failure(3, "Timeout", 0, rng), DeadLetter)


def test_delays_of_exactly_the_longest_duration_are_accepted() -> None:
    fixed = RetryPolicy.fixed([MAX_DURATION_MS])
    backoff = RetryPolicy(initial_delay_ms=1_000, max_delay_ms=MAX_DURATION_MS, max_attempts=2)

    assert fixed.topic_delays_ms() == [MAX_DURATION_MS]
    assert backoff.max_delay_ms == MAX_DURATION_MS


def test_a_multiplier_so_large_that_delays_overflow_is_capped_at_the_maximum() -> None:
    policy = RetryPolicy.exponential("1s,1e308,10m", max_attempts=6)

    assert [policy.nominal_delay_ms(n) for n in range(1, 6)] == [1_000] + [600_000] * 4
    assert policy.topic_delays_ms() == [1_000, 600_000]
