"""Marker codec: round trips, a compact form, and a typed error for any garbage."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core import markers
from kmq_dagster.core.markers import (
    MAX_COUNT,
    MAX_DEADLINE_MS,
    MIN_DEADLINE_MS,
    EndMarker,
    StartMarker,
    decode_marker,
    encode_marker,
)
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


def documented_layout(kind: str) -> tuple[list[str], str]:
    """Field names and the struct format of the layout ``core/markers.py`` documents."""
    layout = (markers.__doc__ or "").split("::", 1)[1]
    fields = re.findall(r"(\w+) (u8|u16|i32|i64)( \(start markers only\))?", layout)
    kept = [(name, code) for name, code, start_only in fields if kind == "start" or not start_only]
    formats = {"u8": "B", "u16": "H", "i32": "i", "i64": "q"}
    return [name for name, _ in kept], ">" + "".join(formats[code] for _, code in kept)


def test_markers_are_laid_out_as_the_module_documents() -> None:
    # given the layout the module docstring documents
    start_names, start_format = documented_layout("start")
    end_names, end_format = documented_layout("end")
    assert start_names == [
        "version",
        "kind",
        "partition",
        "first_offset",
        "count",
        "deadline_ms",
        "topic_length",
    ]
    assert end_names == [name for name in start_names if name != "deadline_ms"]

    # when markers are encoded
    start = encode_marker(StartMarker("orders", 3, 1_000_000, 500, 1_700_000_000_000))
    end = encode_marker(EndMarker("orders", 3, 1_000_000, 1))

    # then they are exactly the documented fields followed by the topic name
    assert start == struct.pack(start_format, 1, 1, 3, 1_000_000, 500, 1_700_000_000_000, 6) + (
        b"orders"
    )
    assert end == struct.pack(end_format, 1, 2, 3, 1_000_000, 1, 6) + b"orders"
    # and the sizes the docstring states are those of this layout: 28 and 20 bytes plus the topic
    sizes = (struct.calcsize(start_format), struct.calcsize(end_format))
    assert sizes == (28, 20)
    assert "start marker takes 28 bytes" in (markers.__doc__ or "")
    assert "end marker takes 20 plus" in (markers.__doc__ or "")


GOOD = encode_marker(StartMarker("orders", 1, 5, 2, 99))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short"),
        (GOOD[:10], "too short"),
        (GOOD[:17], "too short"),
        (GOOD[:18], "without a deadline"),  # the head exactly: a start marker needs more
        (GOOD[:20], "without a deadline"),
        (GOOD[:25], "without a deadline"),
        (GOOD[:26], "without a topic"),  # head and deadline exactly
        (GOOD[:27], "without a topic"),
        (GOOD[:28], "does not match"),  # a topic length but no topic
        (struct.pack(">BBiqi", 1, 2, 0, 0, 1), "without a topic"),  # an end marker's head
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
    [
        ("", 0, 0, 1),
        ("t", -1, 0, 1),
        ("t", 0, -1, 1),
        ("t", 0, 0, 0),
        ("t" * 250, 0, 0, 1),
        ("é" * 125, 0, 0, 1),  # 250 bytes of UTF-8
        ("t", 0, 0, MAX_COUNT + 1),
    ],
)
def test_invalid_fields_are_refused_when_building(fields: tuple[str, int, int, int]) -> None:
    with pytest.raises(ValueError):
        EndMarker(*fields)


def test_fields_at_their_limits_round_trip() -> None:
    # given a 249-byte topic, offset and partition 0, the longest run and extreme deadlines
    longest_topic = "t" * 248 + "."
    built: list[StartMarker | EndMarker] = [
        EndMarker(longest_topic, 0, 0, MAX_COUNT),
        StartMarker("t", 0, 0, 1, MIN_DEADLINE_MS),
        StartMarker("t", 2**31 - 1, 2**63 - 1, 1, MAX_DEADLINE_MS),
    ]

    # then each one decodes to itself
    assert [decode_marker(encode_marker(marker)) for marker in built] == built


@pytest.mark.parametrize("deadline_ms", [MAX_DEADLINE_MS + 1, MIN_DEADLINE_MS - 1])
def test_a_deadline_beyond_64_bits_is_refused_when_building(deadline_ms: int) -> None:
    with pytest.raises(ValueError, match="deadline_ms does not fit 64 bits"):
        StartMarker("t", 0, 0, 1, deadline_ms)
