"""Topic names and durations: one helper builds every name, and names stay legal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.durations import format_duration_ms, parse_duration_ms
from kmq_dagster.core.naming import (
    dlq_topic,
    group_topics,
    markers_topic,
    retry_topic,
    validate_topic_name,
)
from kmq_dagster.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("90s", 90_000),
        ("5m", 300_000),
        ("1h30m", 5_400_000),
        ("7d", 604_800_000),
        ("250ms", 250),
        ("45", 45_000),
        (" 2H ", 7_200_000),
    ],
)
def test_parse_duration(text: str, expected_ms: int) -> None:
    assert parse_duration_ms(text) == expected_ms


@pytest.mark.parametrize("text", ["", "m5", "5x", "5m junk", "-5s", "1.5s"])
def test_bad_durations_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration_ms(text)


@given(st.integers(min_value=0, max_value=10**12))
def test_format_parses_back_and_is_topic_safe(duration_ms: int) -> None:
    text = format_duration_ms(duration_ms)
    assert parse_duration_ms(text) == duration_ms
    validate_topic_name(f"t.{text}")


def test_names_follow_the_design() -> None:
    assert markers_topic("orders", "billing") == "orders.billing.markers"
    assert retry_topic("orders", "billing", 300_000) == "orders.billing.retry.5m"
    assert dlq_topic("orders", "billing") == "orders.billing.dlq"
    assert group_topics("o", "g", [60_000, 5_000, 60_000]) == [
        "o.g.markers",
        "o.g.redelivery",
        "o.g.retry.5s",
        "o.g.retry.1m",
        "o.g.dlq",
    ]


@pytest.mark.parametrize("name", ["", "..", "a b", "ü", "x" * 250, "a/b"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(ConfigError):
        validate_topic_name(name)


def test_a_topic_name_of_exactly_kafkas_limit_is_legal() -> None:
    name = "x" * 249

    assert validate_topic_name(name) == name
