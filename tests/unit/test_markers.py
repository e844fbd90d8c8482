"""Marker codec: round trips, a compact form, and a typed error for any garbage."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.markers import EndMarker, StartMarker, decode_marker, encode_marker
from kmq_dagster.errors import MarkerDecodeError

topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-_0123456789", min_size=1, max_size=249)
offsets = st.integers(min_value=0, max_value=2**63 - 1)
counts = st.integers(min_value=1, max_value=2**31 - 1)
partitions = st.integers(min_value=0, max_value=2**31 - 1)


@given(topics, partitions, offsets, counts, st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_start_markers_round_trip(
    topic: str, partition: int, first: int, count: int, deadline_ms: int
) -> None:
    marker = StartMarker(topic, partition, first, count, deadline_ms)
    assert decode_marker(encode_marker(marker)) == marker


@given(topics, partitions, offsets, counts)
def test_end_markers_round_trip(topic: str, partition: int, first: int, count: int) -> None:
    marker = EndMarker(topic, partition, first, count)
    assert decode_marker(encode_marker(marker)) == marker


def test_markers_are_compact() -> None:
    assert len(encode_marker(StartMarker("orders", 3, 1_000_000, 500, 1_700_000_000_000))) == 34
    assert len(encode_marker(EndMarker("orders", 3, 1_000_000, 1))) == 26


GOOD = encode_marker(StartMarker("orders", 1, 5, 2, 99))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short"),
        (GOOD[:10], "too short"),
        (GOOD[:20], "without a deadline"),
        (GOOD[:27], "without a topic"),
        (GOOD[:-1], "does not match"),
        (GOOD + b"x", "does not match"),
        (b"\x00" + GOOD[1:], "unknown marker version 0"),
        (b"\x02" + GOOD[1:], "unknown marker version 2"),
        (b"\xff" + GOOD[1:], "unknown marker version 255"),
        (GOOD[:1] + b"\x00" + GOOD[2:], "unknown marker kind 0"),
        (GOOD[:1] + b"\x03" + GOOD[2:], "unknown marker kind 3"),
        (GOOD[:-6] + b"\xff\xfe\xfd\xfc\xfb\xfa", "not UTF-8"),
        (struct.pack(">BBiqi", 1, 2, 0, 0, -5) + b"\x00\x01t", "count must be"),
        (struct.pack(">BBiqi", 1, 2, -1, 0, 1) + b"\x00\x01t", "negative"),
        (struct.pack(">BBiqi", 1, 2, 0, 0, 1) + b"\x00\x00", "topic must have"),
    ],
)
def test_malformed_markers_raise_marker_decode_error(data: bytes, message: str) -> None:
    with pytest.raises(MarkerDecodeError, match=message):
        decode_marker(data)


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_marker_decode_error_only(data: bytes) -> None:
    try:
        marker = decode_marker(data)
    except MarkerDecodeError:
        return
    assert encode_marker(marker) == data


@pytest.mark.parametrize(
    "fields",
    [("", 0, 0, 1), ("t", -1, 0, 1), ("t", 0, -1, 1), ("t", 0, 0, 0), ("t" * 250, 0, 0, 1)],
)
def test_invalid_fields_are_refused_when_building(fields: tuple[str, int, int, int]) -> None:
    with pytest.raises(ValueError):
        EndMarker(*fields)
