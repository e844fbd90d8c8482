"""Retry policy: which retry topic, due when, and when to give up."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
        {"multiplier": 0.5},
        {"jitter": 1.0},
        {"max_attempts": 0},
        {"initial_delay_ms": 10, "max_delay_ms": 5},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_backoff_spec_gives_its_retry_topics_and_bad_specs_are_clear_errors() -> None:
    policy = RetryPolicy.exponential("1s,2,3s", max_attempts=5, jitter=0.1)

    assert policy.topic_delays_ms() == [1_000, 2_000, 3_000]
    assert (policy.attempts, policy.jitter) == (5, 0.1)
    for spec in ("1s,2", "1s,x,3s", "5s,2,1s", "1s,0.5,3s"):
        with pytest.raises(ConfigError, match="--retry-backoff takes INITIAL,MULTIPLIER,MAX"):
            RetryPolicy.exponential(spec, max_attempts=3)
