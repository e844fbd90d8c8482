"""The tracker's in-flight state of one markers partition (the kmq ``MarkersQueue``).

State is kept per start marker as a *range*: first offset, count, deadline and a bitmask of
the offsets still open, so a million messages in flight cost a few thousand objects. Each open
offset is open in exactly one range: a later start marker for an open offset (an ``extend``, or
a new delivery after a rebalance) moves it to the new range, with the new deadline.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from kmq_dagster.core.markers import EndMarker, StartMarker


@dataclass(frozen=True, slots=True)
class MessageRef:
    """One message: where it lives in its source topic."""

    topic: str
    partition: int
    offset: int


class _Range:
    __slots__ = ("count", "deadline_ms", "first", "marker_offset", "open_bits", "open_count")

    def __init__(self, marker_offset: int, first: int, count: int, deadline_ms: int) -> None:
        self.marker_offset = marker_offset
        self.first = first
        self.count = count
        self.deadline_ms = deadline_ms
        self.open_bits = (1 << count) - 1  # bit i set: offset first + i is unacknowledged
        self.open_count = count

    def close(self, first: int, count: int) -> int:
        """Clear the offsets ``first .. first+count-1``; returns how many were open."""
        low = max(first, self.first)
        high = min(first + count, self.first + self.count)
        # equivalent mutant (> for >=): at low == high the mask is empty and nothing closes.
        if low >= high:
            return 0
        mask = ((1 << (high - low)) - 1) << (low - self.first)
        closed = (self.open_bits & mask).bit_count()
        self.open_bits &= ~mask
        self.open_count -= closed
        return closed

    def open_offsets(self) -> Iterator[int]:
        bits = self.open_bits
        while bits:
            low_bit = bits & -bits
            yield self.first + low_bit.bit_length() - 1
            bits ^= low_bit


class _SourceRanges:
    """Ranges of one source (topic, partition), ordered by first offset."""

    __slots__ = ("firsts", "longest", "ranges")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.ranges: list[_Range] = []
        self.longest = 0

    def add(self, added: _Range) -> None:
        index = bisect.bisect_right(self.firsts, added.first)
        self.firsts.insert(index, added.first)
        self.ranges.insert(index, added)
        self.longest = max(self.longest, added.count)

    def close(self, first: int, count: int) -> int:
        """Close offsets in every range that holds them; drop ranges left empty."""
        closed = 0
        index = bisect.bisect_left(self.firsts, first + count) - 1
        while index >= 0:
            # equivalent mutant (< for <=): one more range is visited; it ends before ``first``,
            # so it closes nothing (and a listed range always keeps an open offset).
            if self.firsts[index] + self.longest <= first:
                break  # this range and every earlier one end before ``first``
            holder = self.ranges[index]
            closed += holder.close(first, count)
            if holder.open_count == 0:
                del self.firsts[index]
                del self.ranges[index]
            index -= 1
        return closed


class PartitionInflight:
    """In-flight messages whose markers live in one markers partition."""

    def __init__(self) -> None:
        self._sources: dict[tuple[str, int], _SourceRanges] = {}
        self._by_deadline: list[tuple[int, int, _Range, tuple[str, int]]] = []
        self._by_marker: list[tuple[int, int, _Range]] = []
        self._due: list[tuple[_Range, tuple[str, int]]] = []
        self._sequence = itertools.count()
        self._open = 0

    def record_start(self, marker_offset: int, marker: StartMarker) -> None:
        """Messages of ``marker`` are in flight until its deadline; ``marker_offset`` is where
        the marker itself sits in the markers partition (read in increasing order)."""
        source = self._source(marker.topic, marker.partition)
        self._open -= source.close(marker.first_offset, marker.count)
        started = _Range(marker_offset, marker.first_offset, marker.count, marker.deadline_ms)
        source.add(started)
        self._open += marker.count
        sequence = next(self._sequence)
        heapq.heappush(
            self._by_deadline, (marker.deadline_ms, sequence, started, source_key(marker))
        )
        heapq.heappush(self._by_marker, (marker_offset, sequence, started))

    def record_end(self, marker: EndMarker) -> int:
        """Acknowledge the messages of ``marker``; returns how many were still open."""
        source = self._sources.get((marker.topic, marker.partition))
        if source is None:
            return 0
        closed = source.close(marker.first_offset, marker.count)
        self._open -= closed
        return closed

    def overdue(self, now_ms: int, limit: int | None = None) -> list[MessageRef]:
        """Open messages whose deadline is at or before ``now_ms``, earliest deadline first;
        at most ``limit`` of them (a tracker redelivers a large backlog in bounded chunks).

        Reporting changes nothing: a message stays overdue until an end marker (or a later
        start marker) for it is recorded.
        """
        while self._by_deadline and self._by_deadline[0][0] <= now_ms:
            _deadline, _sequence, due, key = heapq.heappop(self._by_deadline)
            self._due.append((due, key))
        self._due = [(due, key) for due, key in self._due if due.open_count]
        # A wall clock may step back: what was due at a later ``now_ms`` may not be due now.
        refs = (
            MessageRef(key[0], key[1], offset)
            for due, key in self._due
            if due.deadline_ms <= now_ms
            for offset in due.open_offsets()
        )
        return list(itertools.islice(refs, limit))

    def oldest_open_deadline_ms(self) -> int | None:
        """Deadline of the oldest start marker (by position) that still has an open message.

        Minus the visibility timeout, that is when the oldest unacknowledged message was handed
        out (later if its deadline was extended).
        """
        if self.smallest_open_marker_offset() is None:
            return None
        return self._by_marker[0][2].deadline_ms

    def smallest_open_marker_offset(self) -> int | None:
        """Offset of the oldest start marker that still has an open message, if any.

        Everything before it is settled, so a tracker may resume reading there.
        """
        while self._by_marker and self._by_marker[0][2].open_count == 0:
            heapq.heappop(self._by_marker)
        return self._by_marker[0][0] if self._by_marker else None

    def inflight_count(self) -> int:
        """How many messages are open."""
        return self._open

    def _source(self, topic: str, partition: int) -> _SourceRanges:
        key = (topic, partition)
        source = self._sources.get(key)
        if source is None:
            source = self._sources[key] = _SourceRanges()
        return source


def source_key(marker: StartMarker | EndMarker) -> tuple[str, int]:
    """The (topic, partition) a marker is about."""
    return (marker.topic, marker.partition)
