"""The circuit breaker state machine, on a fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State, Transition
from kmq_dagster.core.durations import MAX_DURATION_MS
from kmq_dagster.errors import ConfigError

CONFIG = BreakerConfig(
    window_ms=10_000,
    min_calls=10,
    error_rate=0.5,
    consecutive_failures=8,
    cooldown_ms=1_000,
    cooldown_multiplier=2,
    max_cooldown_ms=5_000,
    probes=3,
)
LEGAL = {
    (State.CLOSED, State.OPEN),
    (State.OPEN, State.HALF_OPEN),
    (State.HALF_OPEN, State.OPEN),
    (State.HALF_OPEN, State.CLOSED),
}


def run(breaker: CircuitBreaker, events: list[tuple[int, bool]]) -> list[Transition]:
    """Drive the breaker as a worker does: offer a message every step, process it if allowed."""
    now_ms = 0
    transitions: list[Transition] = []
    for step_ms, ok in events:
        now_ms += step_ms
        moved = breaker.advance(now_ms)
        transitions += [moved] if moved else []
        if breaker.allows():
            breaker.started()
            moved = breaker.record(ok, now_ms)
            transitions += [moved] if moved else []
    return transitions


def test_it_opens_on_the_error_rate_once_enough_calls_were_made() -> None:
    breaker = CircuitBreaker(CONFIG)
    transitions = run(breaker, [(10, True), (10, False)] * 4 + [(10, False)])  # 9 calls: too few

    assert transitions == [] and breaker.state is State.CLOSED
    (opened,) = run(breaker, [(10, False)])  # the 10th call, 6 of 10 failed
    assert (opened.from_state, opened.to_state) == (State.CLOSED, State.OPEN)
    assert opened.window_calls == 10 and opened.error_rate == pytest.approx(0.6)
    assert "error rate 60%" in opened.reason


def test_it_opens_on_consecutive_failures_even_with_a_good_history() -> None:
    breaker = CircuitBreaker(CONFIG)
    run(breaker, [(10, True)] * 100)

    (opened,) = run(breaker, [(10, False)] * 8)

    assert opened.reason == "8 consecutive failures"


def test_old_failures_leave_the_window() -> None:
    breaker = CircuitBreaker(CONFIG)
    run(breaker, [(10, False)] * 7 + [(10, True)])  # 7 of 8 failed, too few calls

    transitions = run(breaker, [(11_000, True)] + [(10, False)] * 4 + [(10, True)] * 5)

    assert transitions == []  # 4 failures of 10 in the window: below 50%
    assert breaker.window(11_170) == (0.4, 10)  # now: 8 x 10 ms + 11 s + 9 x 10 ms


def test_open_lets_nothing_through_until_the_cooldown_then_a_bounded_number_of_probes() -> None:
    breaker = CircuitBreaker(CONFIG)
    run(breaker, [(1, False)] * 8)
    assert breaker.state is State.OPEN
    opened_at = breaker.opened_at_ms

    assert not breaker.allows()
    assert breaker.advance(opened_at + 999) is None
    half = breaker.advance(opened_at + 1_000)
    assert half is not None and half.to_state is State.HALF_OPEN
    for _ in range(3):
        assert breaker.allows()
        breaker.started()
    assert not breaker.allows()  # probes in flight: no more


def test_a_failed_probe_reopens_with_a_growing_capped_cooldown() -> None:
    breaker = CircuitBreaker(CONFIG)
    run(breaker, [(1, False)] * 8)
    cooldowns = []
    for _ in range(5):
        now_ms = breaker.reopens_at_ms()
        breaker.advance(now_ms)
        breaker.started()
        reopened = breaker.record(False, now_ms)
        assert reopened is not None and reopened.to_state is State.OPEN
        cooldowns.append(breaker.cooldown_ms)

    assert cooldowns == [2_000, 4_000, 5_000, 5_000, 5_000]


def test_successful_probes_close_it_and_reset_the_cooldown_and_window() -> None:
    breaker = CircuitBreaker(CONFIG)
    run(breaker, [(1, False)] * 8)
    now_ms = breaker.reopens_at_ms()
    breaker.advance(now_ms)
    breaker.started()
    breaker.record(False, now_ms)  # cooldown 2 s
    now_ms = breaker.reopens_at_ms()
    breaker.advance(now_ms)

    closes = [breaker.record(True, now_ms) for _ in range(3)]

    assert closes[:2] == [None, None]
    assert closes[2] is not None and closes[2].to_state is State.CLOSED
    assert breaker.cooldown_ms == 1_000
    assert breaker.window(now_ms) == (0.0, 0)


def test_a_state_decided_elsewhere_is_adopted() -> None:
    breaker = CircuitBreaker(CONFIG)

    breaker.adopt(State.OPEN, opened_at_ms=5_000, cooldown_ms=4_000)

    assert not breaker.allows()
    assert breaker.advance(9_000) is not None and breaker.state is State.HALF_OPEN


@pytest.mark.parametrize(
    "bad",
    [
        {"error_rate": 0},
        {"error_rate": 1.5},
        {"error_rate": math.nan},
        {"error_rate": math.inf},
        {"probes": 0},
        {"min_calls": 0},
        {"consecutive_failures": 0},
        {"window_ms": 0},
        {"window_ms": -1},
        {"window_ms": MAX_DURATION_MS + 1},
        {"cooldown_ms": 0},
        {"max_cooldown_ms": 10},
        {"max_cooldown_ms": MAX_DURATION_MS + 1},
        {"cooldown_multiplier": 0.5},
        {"cooldown_multiplier": math.nan},
        {"cooldown_multiplier": math.inf},
    ],
)
def test_nonsense_settings_are_config_errors_in_the_librarys_terms(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="breaker") as refused:
        BreakerConfig(**bad)  # type: ignore[arg-type]

    assert "--" not in str(refused.value)  # no CLI flag: the library is used without the CLI


events = st.lists(st.tuples(st.integers(0, 3_000), st.booleans()), max_size=300)


@given(events)
def test_only_legal_transitions_and_never_more_probes_than_configured(
    history: list[tuple[int, bool]],
) -> None:
    breaker = CircuitBreaker(CONFIG)
    now_ms, processed_while_not_closed = 0, 0
    for step_ms, ok in history:
        now_ms += step_ms
        moved = breaker.advance(now_ms)
        if moved and moved.to_state is State.HALF_OPEN:
            processed_while_not_closed = 0
        if breaker.allows():
            if breaker.state is not State.CLOSED:
                processed_while_not_closed += 1
            breaker.started()
            moved = breaker.record(ok, now_ms)
        if moved is not None:
            assert (moved.from_state, moved.to_state) in LEGAL
        assert processed_while_not_closed <= CONFIG.probes
        assert CONFIG.cooldown_ms <= breaker.cooldown_ms <= CONFIG.max_cooldown_ms


@given(st.lists(st.integers(0, 3_000), max_size=300))
def test_a_healthy_service_never_trips_it(steps: list[int]) -> None:
    breaker = CircuitBreaker(CONFIG)

    assert run(breaker, [(step, True) for step in steps]) == []
