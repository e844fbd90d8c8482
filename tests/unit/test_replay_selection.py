"""Replay selection, time parsing and the headers of replayed copies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.cli import main
from kmq_dagster.core.headers import DLQ_REASON, ERROR_TYPE, ORIGINAL_TOPIC, REDELIVERY_COUNT
from kmq_dagster.core.replay import (
    REPLAY_COUNT,
    TO_ORIGINAL,
    TO_RETRY,
    Ago,
    ReplaySelection,
    default_replay_id,
    parse_offsets,
    parse_time,
    parse_time_ms,
    read_replay_count,
    replay_headers,
)
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS
from kmq_dagster.errors import ConfigError

NOW_MS = 1_795_000_000_000
TIMEOUT = [(ERROR_TYPE, b"TimeoutError")]


def test_offsets_parse_into_inclusive_ranges_per_partition() -> None:
    assert parse_offsets("0:10-20, 0:25,1:5-") == {0: ((10, 20), (25, 25)), 1: ((5, 2**63 - 1),)}


def test_partition_and_offset_zero_and_a_one_offset_range_are_legal() -> None:
    assert parse_offsets("0:0,1:7-7") == {0: ((0, 0),), 1: ((7, 7),)}


@pytest.mark.parametrize("text", ["", "0", "x:1", "0:a-b", "0:5-2", "-1:3", "0:1,,"])
def test_malformed_offsets_are_a_clear_error(text: str) -> None:
    with pytest.raises(ConfigError, match="PARTITION:FIRST"):
        parse_offsets(text)


def test_times_are_iso_utc_by_default_or_durations_ago() -> None:
    assert parse_time_ms("2026-11-23T00:00", NOW_MS) == 1_795_392_000_000
    assert parse_time_ms("2026-11-23T01:00+01:00", NOW_MS) == 1_795_392_000_000
    assert parse_time_ms("2h", NOW_MS) == NOW_MS - 7_200_000
    assert parse_time_ms(" 2h ago ", NOW_MS) == NOW_MS - 7_200_000  # as --help words it
    for text in ("yesterday", "ago", "2h agoo", "2hago"):
        with pytest.raises(ConfigError, match="not a time"):
            parse_time_ms(text, NOW_MS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0001-01-01T00:00:00+01:00", "outside the years 1970 to 9999"),  # 0000-12-31 UTC
        ("9999-12-31T23:59:59-01:00", "outside the years 1970 to 9999"),  # year 10000 UTC
        ("1000000d", "too long"),
        ("99999999999999999999d ago", "too long"),
    ],
)
def test_times_without_a_datetime_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_time_ms(text, NOW_MS)


def test_the_first_and_last_instants_kmq_takes_are_times() -> None:
    # dead letters carry milliseconds since 1970: nothing before it can be selected
    assert parse_time_ms("1970-01-01T00:00", NOW_MS) == 0
    assert parse_time_ms("9999-12-31T23:59:59", NOW_MS) == 253_402_300_799_000


def test_every_filter_must_match() -> None:
    selection = ReplaySelection(
        offsets={0: ((10, 20),)}, key=b"k", error_type="TimeoutError", since=100, until=200
    )

    assert selection.matches(0, 15, b"k", TIMEOUT, 150)
    assert not selection.matches(1, 15, b"k", TIMEOUT, 150)  # other partition
    assert not selection.matches(0, 21, b"k", TIMEOUT, 150)  # outside the range
    assert not selection.matches(0, 15, b"j", TIMEOUT, 150)  # other key
    assert not selection.matches(0, 15, b"k", [(ERROR_TYPE, b"ValueError")], 150)
    assert not selection.matches(0, 15, b"k", [], 150)  # no error type at all
    assert not selection.matches(0, 15, b"k", TIMEOUT, 99)  # before --since
    assert not selection.matches(0, 15, b"k", TIMEOUT, 200)  # --until is exclusive


def test_the_edges_of_an_offset_range_and_the_since_time_are_selected() -> None:
    selection = ReplaySelection(offsets={0: ((10, 20),)}, since=100, until=200)

    assert selection.matches(0, 10, None, None, 150)  # the first offset of the range
    assert selection.matches(0, 20, None, None, 150)  # the last one
    assert not selection.matches(0, 9, None, None, 150)
    assert selection.matches(0, 15, None, None, 100)  # dead-lettered exactly at --since
    assert selection.matches(0, 15, None, None, 199)


_SPANS = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 15)).map(lambda s: (s[0], s[0] + s[1])),
    max_size=8,
)


@given(
    st.dictionaries(st.integers(0, 2), _SPANS, min_size=1), st.integers(0, 2), st.integers(0, 80)
)
def test_an_offset_is_selected_exactly_when_one_of_its_partitions_ranges_holds_it(
    spans: dict[int, list[tuple[int, int]]], partition: int, offset: int
) -> None:
    # Ranges as an operator may type them: in any order, overlapping, touching.
    selection = ReplaySelection(offsets={p: tuple(ranges) for p, ranges in spans.items()})
    held = any(first <= offset <= last for first, last in spans.get(partition, []))

    assert selection.matches(partition, offset, None, None, 0) is held


def test_no_filter_selects_everything_and_a_quoted_key_or_error_type_matches_only_itself() -> None:
    assert ReplaySelection().matches(3, 7, None, None, 0)
    quoted = ReplaySelection(key=b"' OR 1=1 --", error_type="x' OR '1'='1")
    assert not quoted.matches(0, 0, b"k", TIMEOUT, 0)
    assert quoted.matches(0, 0, b"' OR 1=1 --", [(ERROR_TYPE, b"x' OR '1'='1")], 0)


def test_since_must_come_before_until() -> None:
    with pytest.raises(ConfigError, match="must come before its end"):
        ReplaySelection(since=200, until=100)
    with pytest.raises(ConfigError, match="must come before its end"):
        ReplaySelection(since=Ago(3_600_000), until=Ago(7_200_000))  # 1 h ago, 2 h ago
    with pytest.raises(ConfigError, match="must come before its end"):
        ReplaySelection(since=Ago(3_600_000), until=NOW_MS - 7_200_000).resolved(NOW_MS)


def test_relative_times_stay_relative_so_the_same_command_is_the_same_replay() -> None:
    # given "--since 2h" typed at two different moments
    selection = ReplaySelection(since=parse_time("2h ago"))

    # then the replay id does not depend on when it runs, and each run resolves it itself
    assert selection == ReplaySelection(since=parse_time("2h"))
    assert selection.describe() == "since 2h ago"
    assert default_replay_id("t", "g", selection, TO_RETRY) == default_replay_id(
        "t", "g", ReplaySelection(since=Ago(7_200_000)), TO_RETRY
    )
    assert selection.resolved(NOW_MS).since == NOW_MS - 7_200_000
    assert not selection.resolved(NOW_MS).matches(0, 0, None, TIMEOUT, NOW_MS - 7_200_001)
    assert selection.resolved(NOW_MS).matches(0, 0, None, TIMEOUT, NOW_MS - 7_200_000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1000000d", "too long"),
        ("0001-01-01T00:00:00+01:00", "outside the years 1970 to 9999"),
        ("9999-12-31T23:59:59-05:00", "outside the years 1970 to 9999"),
        ("1969-12-31", "outside the years 1970 to 9999"),
        ("36500d", "outside the years 1970 to 9999"),  # a legal duration, but before 1970
    ],
)
def test_times_outside_1970_to_9999_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_time_ms(text, NOW_MS)


@pytest.mark.parametrize("until_ms", [100, 200])
def test_since_must_come_strictly_before_until(until_ms: int) -> None:
    with pytest.raises(ConfigError, match="must come before its end"):
        ReplaySelection(since=200, until=until_ms)  # equal times select nothing


def test_since_one_millisecond_before_until_selects_that_millisecond() -> None:
    selection = ReplaySelection(since=100, until=101)

    assert selection.matches(0, 0, None, None, 100)


def test_the_same_replay_gets_the_same_id_and_another_one_another() -> None:
    one = ReplaySelection(error_type="TimeoutError")
    assert default_replay_id("t", "g", one, TO_RETRY) == default_replay_id("t", "g", one, TO_RETRY)
    assert default_replay_id("t", "g", one, TO_RETRY) != default_replay_id(
        "t", "g", one, TO_ORIGINAL
    )
    assert default_replay_id("t", "g", one, TO_RETRY) != default_replay_id(
        "t", "g", ReplaySelection(), TO_RETRY
    )


def test_replay_count_is_read_and_garbage_never_passes_the_limit() -> None:
    assert read_replay_count(None) == 0
    assert read_replay_count([(REPLAY_COUNT, b"2")]) == 2
    assert read_replay_count([(REPLAY_COUNT, b"lots")]) >= 1_000


def test_a_retry_copy_is_due_now_as_attempt_two_and_an_original_copy_starts_afresh() -> None:
    to_retry = replay_headers(TO_RETRY, 1, NOW_MS)
    assert to_retry.updates == {
        REPLAY_COUNT: "2",
        ATTEMPT: "2",
        DUE_MS: str(NOW_MS),
        REDELIVERY_COUNT: "0",
    }
    assert to_retry.drop == (DLQ_REASON,)

    to_original = replay_headers(TO_ORIGINAL, 0, NOW_MS)
    assert to_original.updates == {REPLAY_COUNT: "1"}
    assert {ATTEMPT, DUE_MS, DLQ_REASON, ERROR_TYPE, REDELIVERY_COUNT} <= set(to_original.drop)
    assert ORIGINAL_TOPIC not in to_original.drop  # the origin survives every hop


@pytest.mark.parametrize("command", [["replay"], ["dlq", "list"]])
@pytest.mark.parametrize("offsets", ["", " ", ","])
def test_an_empty_offsets_selection_is_an_error_not_every_dead_letter(
    command: list[str], offsets: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # when a command that selects dead letters is given an empty --offsets (a script's empty
    # variable), it refuses before it reads anything
    code = main([*command, "-t", "orders", "-g", "billing", "--offsets", offsets])

    # then it is one error line naming the option, never a selection of every dead letter
    assert code != 0
    assert "offsets are PARTITION:FIRST[-LAST]" in capsys.readouterr().err
