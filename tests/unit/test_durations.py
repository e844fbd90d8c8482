"""Durations are bounded when parsed, so every deadline computed from one fits its encoding."""

from __future__ import annotations

import pytest

from kmq_dagster.core.durations import (
    MAX_DURATION_MS,
    format_duration_ms,
    parse_duration_ms,
    seconds_from_env,
)
from kmq_dagster.core.markers import StartMarker, decode_marker, encode_marker
from kmq_dagster.errors import ConfigError

#: A clock reading far in the future: the year 9000.
YEAR_9000_MS = 221_845_392_000_000


def test_the_longest_duration_is_accepted_in_any_unit() -> None:
    assert format_duration_ms(MAX_DURATION_MS) == "36500d"
    for text in ("36500d", "876000h", f"{MAX_DURATION_MS}ms", "36499d23h59m59s1000ms"):
        assert parse_duration_ms(text) == MAX_DURATION_MS


@pytest.mark.parametrize(
    "text",
    [
        "36501d",
        f"{MAX_DURATION_MS + 1}ms",
        "36500d1ms",
        "99999999999999999999d",
        "9" * 5_000,  # more digits than int() converts
        "1" + "0" * 30 + "s",
    ],
)
def test_longer_durations_are_a_clear_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="too long: kmq accepts at most 36500d"):
        parse_duration_ms(text)


def test_leading_zeros_do_not_count_against_the_bound() -> None:
    assert parse_duration_ms("0" * 40 + "5s") == 5_000


@pytest.mark.parametrize("text", ["²", "٣s", "1٣s", "inf", "nan"])
def test_non_ascii_digits_and_float_words_are_not_durations(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration_ms(text)


def test_a_deadline_of_now_plus_the_longest_duration_fits_a_start_marker() -> None:
    # given a clock far in the future and the longest visibility timeout
    deadline_ms = YEAR_9000_MS + parse_duration_ms("36500d")

    # when the start marker is encoded
    marker = StartMarker("orders", 0, 0, 1, deadline_ms)

    # then it round-trips
    assert decode_marker(encode_marker(marker)) == marker


def test_zero_formats_and_negative_durations_are_refused() -> None:
    assert format_duration_ms(0) == "0s"
    assert parse_duration_ms("0s") == 0
    with pytest.raises(ConfigError, match="negative duration"):
        format_duration_ms(-1)


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "nan", "inf"])
def test_seconds_from_the_environment_must_be_positive_and_finite(raw: str) -> None:
    with pytest.raises(ConfigError, match="KMQ_X_S must be a positive number of seconds"):
        seconds_from_env({"KMQ_X_S": raw}, "KMQ_X_S", 5.0)


def test_seconds_from_the_environment_default_when_unset_and_zero_where_allowed() -> None:
    assert seconds_from_env({}, "KMQ_X_S", 5.0) == 5.0
    assert seconds_from_env({"KMQ_X_S": "2.5"}, "KMQ_X_S", 5.0) == 2.5
    assert seconds_from_env({"KMQ_X_S": "0"}, "KMQ_X_S", 5.0, zero_allowed=True) == 0.0
    with pytest.raises(ConfigError, match="KMQ_X_S must be a number of seconds >= 0"):
        seconds_from_env({"KMQ_X_S": "-0.5"}, "KMQ_X_S", 5.0, zero_allowed=True)
