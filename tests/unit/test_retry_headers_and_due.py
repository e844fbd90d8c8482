"""Retry copy headers (user headers kept, garbage reported) and the never-early split."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.due import split_due
from kmq_dagster.core.headers import (
    DLQ_REASON,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    replace_headers,
)
from kmq_dagster.core.retry_headers import (
    ATTEMPT,
    DUE_MS,
    TRACEBACK,
    Failure,
    Origin,
    copy_headers,
    origin_of,
    read_attempt,
    read_due_ms,
    truncate_utf8,
)


def test_a_retry_copy_keeps_user_headers_and_says_what_failed() -> None:
    user = [("trace", b"\xff"), ("tenant", b"acme")]
    updates = copy_headers(
        Origin("orders", 2, 41, 1_000),
        "billing",
        Failure("TimeoutError", "upstream slow", "Traceback ...\n" * 2_000),
        attempt=2,
        due_ms=61_000,
    )
    headers = dict(replace_headers(user, updates))
    assert headers["trace"] == b"\xff" and headers["tenant"] == b"acme"
    assert headers[ATTEMPT] == b"2"
    assert headers[DUE_MS] == b"61000"
    assert headers[ORIGINAL_TOPIC] == b"orders"
    assert len(headers[TRACEBACK] or b"") <= 8_192
    assert DLQ_REASON not in headers


def test_a_later_hop_keeps_the_first_origin() -> None:
    first = copy_headers(Origin("orders", 1, 7, 5), "g", Failure("E", "m"), attempt=2, due_ms=9)
    headers = replace_headers([], first)
    assert origin_of(headers, "orders.g.retry.5s", 0, 300, 99) == Origin("orders", 1, 7, 5)
    assert origin_of([], "orders", 3, 4, 5) == Origin("orders", 3, 4, 5)


def _origin(headers: list[tuple[str, bytes]]) -> object:
    return origin_of(headers, "t", 0, 0, 0)


@pytest.mark.parametrize(
    ("reader", "headers"),
    [
        (read_attempt, [(ATTEMPT, b"zero")]),
        (read_attempt, [(ATTEMPT, b"0")]),
        (read_attempt, [(ATTEMPT, b"\xff")]),
        (read_due_ms, [(DUE_MS, b"-5")]),
        (read_due_ms, [(DUE_MS, b"soon")]),
        (_origin, [(ORIGINAL_TOPIC, b"o"), (ORIGINAL_PARTITION, b"x"), (ORIGINAL_OFFSET, b"1")]),
        (_origin, [(ORIGINAL_TOPIC, b"orders")]),
        (_origin, [(ORIGINAL_TOPIC, b"\xff"), (ORIGINAL_PARTITION, b"1"), (ORIGINAL_OFFSET, b"1")]),
    ],
)
def test_garbage_retry_metadata_raises_value_error(
    reader: Callable[[list[tuple[str, bytes]]], object], headers: list[tuple[str, bytes]]
) -> None:
    with pytest.raises(ValueError):
        reader(headers)


def test_missing_retry_metadata_means_a_first_attempt_due_now() -> None:
    assert read_attempt(None) == 1
    assert read_due_ms([("other", b"1")]) is None


def test_attempt_one_is_the_lowest_legal_attempt() -> None:
    assert read_attempt([(ATTEMPT, b"1")]) == 1
    with pytest.raises(ValueError, match="at least 1"):
        read_attempt([(ATTEMPT, b"0")])


def test_a_text_of_exactly_the_limit_is_kept_whole_and_one_byte_more_is_cut() -> None:
    text = "é" * 10  # 20 bytes of UTF-8

    assert truncate_utf8(text, 20) == text
    assert truncate_utf8(text + "x", 20) == "ééé...[truncated]"  # 20 - 14 bytes: three é


def test_a_message_due_exactly_now_runs_and_one_due_a_millisecond_later_waits() -> None:
    messages = [(0, 100), (1, 101)]  # (offset, due)

    split = split_due(messages, 100, lambda m: m[1], lambda m: m[0])

    assert (split.ready, split.resume_offset, split.resume_at_ms) == ([(0, 100)], 1, 101)


@given(st.text(max_size=3_000), st.integers(20, 2_000))
def test_truncation_never_exceeds_the_limit_or_splits_a_character(text: str, limit: int) -> None:
    cut = truncate_utf8(text, limit)
    if len(text.encode("utf-8")) <= limit:
        assert cut == text
    else:
        assert len(cut.encode("utf-8")) <= limit
        assert cut.endswith("...[truncated]")
        assert text.startswith(cut.removesuffix("...[truncated]"))  # no character split


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 100)), max_size=30),
    st.integers(0, 100),
)
def test_split_never_lets_a_message_run_before_it_is_due(dues: list[int | None], now: int) -> None:
    messages = list(enumerate(dues))  # (offset, due)
    split = split_due(messages, now, lambda m: m[1], lambda m: m[0])
    # nothing early
    assert all(due is None or due <= now for _, due in split.ready)
    # the ready part is a prefix, and it stops exactly at the first message not due
    assert split.ready == messages[: len(split.ready)]
    if split.resume_offset is None:
        assert len(split.ready) == len(messages)
    else:
        waiting = messages[len(split.ready)]
        assert split.resume_offset == waiting[0]
        assert split.resume_at_ms == waiting[1]
        assert waiting[1] is not None and waiting[1] > now
