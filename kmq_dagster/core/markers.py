"""Start and end markers, and their compact versioned binary form.

A marker covers a contiguous run of offsets of one source partition: a consumer writes one
start marker per run of a fetched batch, not one per message, and coalesces acks into end
markers the same way. Layout (big-endian)::

    version u8 | kind u8 | partition i32 | first_offset i64 | count i32
    | deadline_ms i64 (start markers only) | topic_length u16 | topic UTF-8

A start marker takes 28 bytes plus its topic's UTF-8 bytes; an end marker takes 20 plus them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kmq_dagster.errors import MarkerDecodeError

#: Version byte written first in every marker; decoders refuse versions they do not know.
MARKER_FORMAT_VERSION = 1
#: Kind byte of a start marker ("in flight until deadline_ms").
START_KIND = 1
#: Kind byte of an end marker ("acknowledged").
END_KIND = 2
#: Kafka's longest topic name, in bytes.
MAX_TOPIC_BYTES = 249
#: Longest run one marker may cover.
MAX_COUNT = 2**31 - 1
#: A deadline is a signed 64-bit number of milliseconds since the epoch.
MIN_DEADLINE_MS = -(2**63)
MAX_DEADLINE_MS = 2**63 - 1

_HEAD = struct.Struct(">BBiqi")
_DEADLINE = struct.Struct(">q")
_TOPIC_LENGTH = struct.Struct(">H")


@dataclass(frozen=True, slots=True)
class _OffsetRun:
    """What both kinds of marker say: offsets ``first_offset .. first_offset+count-1`` of
    ``topic``'s ``partition``."""

    topic: str
    partition: int
    first_offset: int
    count: int

    def __post_init__(self) -> None:
        if not self.topic or len(self.topic.encode()) > MAX_TOPIC_BYTES:
            raise ValueError(
                f"topic must have 1 to {MAX_TOPIC_BYTES} UTF-8 bytes: {self.topic[:40]!r}"
            )
        if self.partition < 0 or self.first_offset < 0:
            raise ValueError(f"negative partition or offset: {self.partition}, {self.first_offset}")
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"count must be 1 to {MAX_COUNT}, got {self.count}")


@dataclass(frozen=True, slots=True)
class StartMarker(_OffsetRun):
    """Offsets ``first_offset .. first_offset+count-1`` are in flight until ``deadline_ms``."""

    deadline_ms: int

    def __post_init__(self) -> None:
        _OffsetRun.__post_init__(self)  # (slots: the class is rebuilt, so no bare super())
        if not MIN_DEADLINE_MS <= self.deadline_ms <= MAX_DEADLINE_MS:
            raise ValueError(f"deadline_ms does not fit 64 bits: {self.deadline_ms}")


@dataclass(frozen=True, slots=True)
class EndMarker(_OffsetRun):
    """Offsets ``first_offset .. first_offset+count-1`` are acknowledged."""


Marker = StartMarker | EndMarker


def encode_marker(marker: Marker) -> bytes:
    """The binary form of ``marker``, laid out as the module docstring shows."""
    kind = START_KIND if isinstance(marker, StartMarker) else END_KIND
    parts = [
        _HEAD.pack(MARKER_FORMAT_VERSION, kind, marker.partition, marker.first_offset, marker.count)
    ]
    if isinstance(marker, StartMarker):
        parts.append(_DEADLINE.pack(marker.deadline_ms))
    topic = marker.topic.encode()
    parts += [_TOPIC_LENGTH.pack(len(topic)), topic]
    return b"".join(parts)


def decode_marker(data: bytes) -> Marker:
    """Parse a marker written by :func:`encode_marker`.

    Raises:
        MarkerDecodeError: the bytes are not a marker of a known version, whatever they are.
    """
    if len(data) < _HEAD.size:
        raise MarkerDecodeError(f"marker too short: {len(data)} bytes")
    version, kind, partition, first_offset, count = _HEAD.unpack_from(data)
    if version != MARKER_FORMAT_VERSION:
        raise MarkerDecodeError(f"unknown marker version {version}")
    if kind not in (START_KIND, END_KIND):
        raise MarkerDecodeError(f"unknown marker kind {kind}")
    position = _HEAD.size
    deadline_ms = 0
    if kind == START_KIND:
        if len(data) < position + _DEADLINE.size:
            raise MarkerDecodeError("start marker without a deadline")
        (deadline_ms,) = _DEADLINE.unpack_from(data, position)
        position += _DEADLINE.size
    if len(data) < position + _TOPIC_LENGTH.size:
        raise MarkerDecodeError("marker without a topic")
    (topic_length,) = _TOPIC_LENGTH.unpack_from(data, position)
    position += _TOPIC_LENGTH.size
    if len(data) != position + topic_length:
        raise MarkerDecodeError(
            f"marker length {len(data)} does not match its topic length {topic_length}"
        )
    try:
        topic = data[position:].decode("utf-8")
    except UnicodeDecodeError:
        raise MarkerDecodeError("marker topic is not UTF-8") from None
    try:
        if kind == START_KIND:
            return StartMarker(topic, partition, first_offset, count, deadline_ms)
        return EndMarker(topic, partition, first_offset, count)
    except ValueError as exc:
        raise MarkerDecodeError(f"invalid marker: {exc}") from None
