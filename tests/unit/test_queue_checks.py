"""The queue health checks decide pass, severity and wording from figures (pure)."""

from __future__ import annotations

from kmq_dagster.core.queue_checks import (
    ERROR,
    WARN,
    breaker_closed,
    dead_letters_not_growing,
    format_epoch_ms,
    oldest_unacked_age,
    output_matches_acks,
)


def test_dead_letters_warn_only_above_the_threshold() -> None:
    assert dead_letters_not_growing(5, threshold=5, window_ms=60_000).passed
    above = dead_letters_not_growing(6, threshold=5, window_ms=60_000)
    assert not above.passed
    assert above.severity == WARN
    assert above.description == "6 new dead letters in the last 1m (more than 5 allowed)"


def test_one_dead_letter_reads_in_the_singular_with_its_window_as_a_duration() -> None:
    one = dead_letters_not_growing(1, threshold=0, window_ms=900_000)
    assert one.description == "1 new dead letter in the last 15m (more than 0 allowed)"


def test_oldest_unacked_fails_past_every_delivery_the_queue_allows() -> None:
    # visibility 30 s and 3 redeliveries: a message may be in flight 4 x 30 s = 2 min
    limit = {"visibility_timeout_ms": 30_000, "max_redeliveries": 3}
    assert oldest_unacked_age(None, **limit).passed
    assert oldest_unacked_age(120_000, **limit).passed
    late = oldest_unacked_age(120_001, **limit)
    assert not late.passed
    assert late.severity == ERROR
    assert "tracker" in late.description


def test_the_breaker_check_fails_while_open_or_probing() -> None:
    assert breaker_closed("closed").passed
    assert breaker_closed("unknown").passed
    opened = breaker_closed("open", opened_at_ms=1_795_461_928_000, cooldown_ms=10_000)
    assert not opened.passed
    assert opened.severity == ERROR
    assert opened.description == (
        "circuit breaker open since 2026-11-23 19:25:28 UTC, probing after 10s"
    )
    assert not breaker_closed("half_open").passed


def test_every_acknowledged_message_must_have_its_output_row() -> None:
    assert output_matches_acks(190, 190, 190, exact=True).passed
    assert not output_matches_acks(189, 189, 190, exact=True).passed
    assert not output_matches_acks(191, 191, 190, exact=True).passed
    # duplicates after a rebalance are acknowledged twice: counted, not a failure
    duplicated = output_matches_acks(200, 190, 200, exact=True)
    assert duplicated.passed
    assert duplicated.figures["duplicates"] == 10
    assert duplicated.description.endswith(
        "190 distinct by (topic, partition, offset), 10 duplicates"
    )


def test_a_transform_may_filter_rows_but_not_invent_messages() -> None:
    assert output_matches_acks(100, 100, 190, exact=False).passed
    assert not output_matches_acks(191, 191, 190, exact=False).passed


def test_epoch_times_read_as_utc() -> None:
    assert format_epoch_ms(0) == "1970-01-01 00:00:00 UTC"
