"""Header codec and offset runs: user headers survive, garbage is reported, runs coalesce."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.headers import REDELIVERY_COUNT, int_header, replace_headers
from kmq_dagster.core.ranges import offset_runs


def test_replace_keeps_user_headers_in_order_and_sets_kmq_ones() -> None:
    headers = [("trace", b"1"), (REDELIVERY_COUNT, b"1"), ("trace", b"2"), ("bin", b"\xff")]
    replaced = replace_headers(headers, {REDELIVERY_COUNT: "2"})
    assert replaced == [
        ("trace", b"1"),
        ("trace", b"2"),
        ("bin", b"\xff"),
        (REDELIVERY_COUNT, b"2"),
    ]


@pytest.mark.parametrize("raw", [b"", b"-1", b"x", b"\xff\xfe", b"1.5", "٣".encode()])
def test_garbage_integer_headers_raise_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match=REDELIVERY_COUNT):
        int_header([(REDELIVERY_COUNT, raw)], REDELIVERY_COUNT)


def test_missing_integer_header_is_none_and_last_value_wins() -> None:
    assert int_header(None, REDELIVERY_COUNT) is None
    assert int_header([(REDELIVERY_COUNT, b"1"), (REDELIVERY_COUNT, b"3")], REDELIVERY_COUNT) == 3


@given(st.lists(st.integers(min_value=0, max_value=300)))
def test_runs_cover_exactly_the_offsets(offsets: list[int]) -> None:
    runs = offset_runs(offsets)
    covered = [first + i for first, count in runs for i in range(count)]
    assert covered == sorted(set(offsets))
    # runs are maximal: two runs never touch
    assert all(a[0] + a[1] < b[0] for a, b in itertools.pairwise(runs))
