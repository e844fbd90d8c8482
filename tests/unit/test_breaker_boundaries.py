"""The circuit breaker at its exact edges: thresholds, the window's edge, settings at their
limits, probe rounds. Each test fails if one comparison in ``core/breaker.py`` is flipped."""

from __future__ import annotations

from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State
from kmq_dagster.core.queue_settings import BREAKER_SETTINGS, setting_named
from tests.unit.test_breaker import CONFIG


def record_all(breaker: CircuitBreaker, outcomes: list[bool], now_ms: int) -> list[State]:
    """Record ``outcomes`` at ``now_ms``; the state after each one."""
    states = []
    for ok in outcomes:
        breaker.started()
        breaker.record(ok, now_ms)
        states.append(breaker.state)
    return states


def opened(config: BreakerConfig = CONFIG) -> CircuitBreaker:
    """A breaker that opened at t=0 on consecutive failures."""
    breaker = CircuitBreaker(config)
    record_all(breaker, [False] * config.consecutive_failures, 0)
    assert breaker.state is State.OPEN
    return breaker


def fail_probe(breaker: CircuitBreaker) -> int:
    """Let the cooldown pass, fail the first probe; the new cooldown (ms)."""
    now_ms = breaker.reopens_at_ms()
    breaker.advance(now_ms)
    breaker.started()
    breaker.record(False, now_ms)
    assert breaker.state is State.OPEN
    return breaker.cooldown_ms


def test_an_error_rate_exactly_at_the_threshold_opens_it() -> None:
    # given 5 successes, then failures: too few calls, or a rate below 50 %, keep it closed
    breaker = CircuitBreaker(CONFIG)
    states = record_all(breaker, [True] * 5 + [False] * 4, now_ms=0)
    assert states[-1] is State.CLOSED  # 4 of 9 failed

    # when the 10th call fails: 5 of 10, exactly the configured 50 %
    (state,) = record_all(breaker, [False], now_ms=0)

    # then it opens
    assert state is State.OPEN


def test_a_rate_just_below_the_threshold_keeps_it_closed() -> None:
    breaker = CircuitBreaker(CONFIG)

    states = record_all(breaker, [True] * 6 + [False] * 4, now_ms=0)  # 4 of 10

    assert states[-1] is State.CLOSED


def test_a_call_exactly_window_ms_old_still_counts_and_one_ms_later_it_does_not() -> None:
    # given a breaker that opens when 2 calls in the window both failed
    config = BreakerConfig(window_ms=10_000, min_calls=2, error_rate=1.0, consecutive_failures=99)
    at_edge, past_edge = CircuitBreaker(config), CircuitBreaker(config)
    for breaker in (at_edge, past_edge):
        record_all(breaker, [False], now_ms=0)

    # when the second failure comes exactly window_ms later, or 1 ms after that
    record_all(at_edge, [False], now_ms=10_000)
    record_all(past_edge, [False], now_ms=10_001)

    # then the first failure still counts at the edge only
    assert at_edge.state is State.OPEN
    assert past_edge.state is State.CLOSED and past_edge.window(10_001) == (1.0, 1)


def test_settings_at_their_lowest_legal_values_work() -> None:
    # given every setting at its smallest legal value
    config = BreakerConfig(
        window_ms=1,
        min_calls=1,
        error_rate=1.0,
        consecutive_failures=1,
        cooldown_ms=1,
        cooldown_multiplier=1,
        max_cooldown_ms=1,
        probes=1,
    )
    breaker = CircuitBreaker(config)

    # then one failure opens it, the cooldown never grows, and one good probe closes it
    assert record_all(breaker, [False], now_ms=0) == [State.OPEN]
    assert [fail_probe(breaker) for _ in range(3)] == [1, 1, 1]
    breaker.advance(breaker.reopens_at_ms())
    assert breaker.allows()
    assert record_all(breaker, [True], now_ms=breaker.reopens_at_ms()) == [State.CLOSED]


def test_an_error_rate_of_exactly_one_opens_only_when_every_call_failed() -> None:
    config = BreakerConfig(min_calls=4, error_rate=1.0, consecutive_failures=99)
    breaker = CircuitBreaker(config)

    assert record_all(breaker, [True, False, False, False], now_ms=0)[-1] is State.CLOSED
    assert record_all(CircuitBreaker(config), [False] * 4, now_ms=0)[-1] is State.OPEN


def test_durations_of_exactly_the_longest_a_breaker_takes_are_accepted() -> None:
    longest = int(setting_named("window_ms", BREAKER_SETTINGS).high or 0)  # a week
    config = BreakerConfig(window_ms=longest, cooldown_ms=longest, max_cooldown_ms=longest)

    breaker = opened(config)

    assert breaker.reopens_at_ms() == longest


def test_a_multiplier_of_one_keeps_the_cooldown_and_a_cap_equal_to_it_too() -> None:
    constant = opened(BreakerConfig(cooldown_ms=1_000, cooldown_multiplier=1))
    capped = opened(BreakerConfig(cooldown_ms=1_000, max_cooldown_ms=1_000))

    assert [fail_probe(constant) for _ in range(3)] == [1_000, 1_000, 1_000]
    assert [fail_probe(capped) for _ in range(3)] == [1_000, 1_000, 1_000]


def test_a_huge_multiplier_caps_the_cooldown_instead_of_overflowing() -> None:
    breaker = opened(BreakerConfig(cooldown_ms=10_000, cooldown_multiplier=1e308))

    assert [fail_probe(breaker) for _ in range(3)] == [300_000, 300_000, 300_000]


def test_adopting_half_open_after_an_earlier_probe_round_starts_a_fresh_round() -> None:
    # given a probe round with every probe started and two of three succeeded
    breaker = opened()
    now_ms = breaker.reopens_at_ms()
    breaker.advance(now_ms)
    record_all(breaker, [True, True], now_ms)
    breaker.started()
    assert not breaker.allows()

    # when another worker's HALF_OPEN is adopted (it took over probing)
    breaker.adopt(State.HALF_OPEN, opened_at_ms=0, cooldown_ms=1_000)

    # then this worker may probe again, and needs a whole round of successes to close
    assert breaker.allows()
    assert record_all(breaker, [True, True, True], now_ms) == [
        State.HALF_OPEN,
        State.HALF_OPEN,
        State.CLOSED,
    ]


def test_a_released_probe_lets_another_one_through_and_counts_for_nothing() -> None:
    # given a HALF_OPEN breaker whose three probes are all started
    breaker = opened()
    now_ms = breaker.reopens_at_ms()
    breaker.advance(now_ms)
    for _ in range(3):
        breaker.started()
    assert not breaker.allows()

    # when one ends with an outcome that does not count (a fatal error)
    breaker.release()

    # then exactly one more probe may start, and the round still needs three successes
    assert breaker.allows()
    breaker.started()
    assert not breaker.allows()
    assert [breaker.record(True, now_ms) for _ in range(2)] == [None, None]
    assert breaker.state is State.HALF_OPEN


def test_releasing_more_than_was_started_never_allows_extra_probes() -> None:
    breaker = opened()
    breaker.advance(breaker.reopens_at_ms())

    for _ in range(5):
        breaker.release()

    for _ in range(3):
        assert breaker.allows()
        breaker.started()
    assert not breaker.allows()
