"""Figures read by a person on call: rates to sensible precision, ages as rounded durations
("-" when there is none, never "None"), shares as percentages, chart buckets sized to the
window; and a breaker's transitions and quiet ticks in words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.breaker_alerts import TransitionEvent
from kmq_dagster.core.breaker_config import State
from kmq_dagster.core.breaker_reports import (
    describe_quiet_tick,
    describe_transition,
    outage_ms,
    transition_verb,
)
from kmq_dagster.core.readable import (
    MAX_BUCKETS,
    NOTHING,
    arrival_bucket_s,
    bucket_label,
    bucket_starts_s,
    duration_text,
    percent_text,
    rate_text,
)


@pytest.mark.parametrize(
    ("per_s", "shown"),
    [(None, "-"), (0.0, "0 /s"), (0.0383, "0.038 /s"), (3.8183, "3.8 /s"), (99.96, "100 /s"),
     (180.0, "180 /s"), (12_345.6, "12,346 /s")],
)  # fmt: skip
def test_rates_show_the_digits_that_matter(per_s: float | None, shown: str) -> None:
    assert rate_text(per_s) == shown


@pytest.mark.parametrize(
    ("age_ms", "shown"),
    [(None, "-"), (0, "0 ms"), (850, "850 ms"), (999.6, "1s"), (42_345, "42s"),
     (72_400, "1m 12s"), (3_599_500, "1h"), (7_500_000, "2h 5m"), (90_061_000, "1d 1h")],
)  # fmt: skip
def test_ages_read_as_rounded_durations(age_ms: float | None, shown: str) -> None:
    assert duration_text(age_ms) == shown


@given(st.integers(min_value=0, max_value=10**12))
def test_a_duration_is_at_most_two_units_and_never_none(age_ms: int) -> None:
    shown = duration_text(age_ms)
    assert shown != NOTHING and "None" not in shown
    assert len(shown.split()) <= 2


@pytest.mark.parametrize(
    ("fraction", "shown"),
    [(None, "-"), (0.0, "0%"), (0.0001, "0.1%"), (0.004, "0.4%"), (0.02, "2%"), (0.6, "60%"),
     (0.999, "99.9%"), (0.99999, "99.9%"), (1.0, "100%")],
)  # fmt: skip
def test_error_rates_are_percentages_that_never_round_to_none_or_all(
    fraction: float | None, shown: str
) -> None:
    assert percent_text(fraction) == shown


@pytest.mark.parametrize(
    ("window_s", "bucket_s"),
    [(600, 60), (3_600, 60), (86_400, 600), (7 * 86_400, 3_600), (90 * 86_400, 86_400)],
)
def test_arrival_buckets_fit_the_window(window_s: int, bucket_s: int) -> None:
    assert arrival_bucket_s(window_s) == bucket_s


@given(st.integers(min_value=60, max_value=150 * 86_400))
def test_a_window_never_draws_more_bars_than_fit_unless_days_do_not(window_s: int) -> None:
    bucket_s = arrival_bucket_s(window_s)
    assert window_s / bucket_s <= MAX_BUCKETS or bucket_s == 86_400


def test_every_bucket_of_the_window_gets_a_bar_starting_on_a_round_time() -> None:
    # given: a window from 10:02:10 to 10:05:30 (epoch seconds of a whole hour + offsets)
    hour = 1_795_460_400
    starts = bucket_starts_s(hour + 130, hour + 330, 60)
    assert starts == [hour + 120, hour + 180, hour + 240, hour + 300]
    assert bucket_label(600) == "per 10m (UTC, bar = its start)"


def _event(id_: int, before: State, after: State, at_s: int, reason: str = "r") -> TransitionEvent:
    return TransitionEvent(id_, before, after, at_s * 1000, reason)


OUTAGE = [
    _event(1, State.CLOSED, State.OPEN, 100, "error rate 60% over 20 messages in 30s"),
    _event(2, State.OPEN, State.HALF_OPEN, 120, "cooldown over: probing"),
    _event(3, State.HALF_OPEN, State.OPEN, 121, "2 of 3 probe messages failed; cooldown 40s"),
    _event(4, State.OPEN, State.HALF_OPEN, 161, "cooldown over: probing"),
    _event(5, State.HALF_OPEN, State.CLOSED, 172, "3 of 3 messages processed while probing"),
]


def test_transitions_read_as_what_the_breaker_did() -> None:
    verbs = [transition_verb(t.from_state, t.to_state) for t in OUTAGE]
    assert verbs == ["opened", "probing", "reopened", "probing", "closed"]
    assert describe_transition(OUTAGE[0], OUTAGE) == (
        "opened: error rate 60% over 20 messages in 30s"
    )
    # the close counts from the opening that began the outage, not the last reopening
    assert describe_transition(OUTAGE[4], OUTAGE) == (
        "closed after 1m 12s: 3 of 3 messages processed while probing"
    )
    assert outage_ms(OUTAGE, OUTAGE[2]) is None


def test_a_close_without_its_opening_in_view_says_no_duration() -> None:
    assert describe_transition(OUTAGE[4], OUTAGE[3:]) == (
        "closed: 3 of 3 messages processed while probing"
    )


def test_quiet_ticks_say_what_the_sensor_saw_and_what_comes_next() -> None:
    closed = describe_quiet_tick(State.CLOSED, failures=1, messages=40, window_ms=30_000, now_ms=0)
    assert closed == "breaker closed, error rate 2% over 40 messages in the last 30s; nothing to do"
    idle = describe_quiet_tick(State.CLOSED, failures=0, messages=0, window_ms=60_000, now_ms=0)
    assert idle == "breaker closed, error rate 0% over 0 messages in the last 1m; nothing to do"
    opened = describe_quiet_tick(
        State.OPEN, failures=0, messages=0, window_ms=30_000, opened_at_ms=1_795_461_928_000,
        cooldown_ms=20_000, now_ms=1_795_461_936_000,
    )  # fmt: skip
    assert opened == "breaker open since 2026-11-23 19:25:28 UTC; probing in 12s"
