"""Which dead letters a replay moves, and the headers of a replayed copy (pure).

A selection combines filters with AND: DLQ offsets per partition, key, error type, and the
time the message was dead-lettered. A replayed copy carries ``kmq-replay-count``; a dead letter
already replayed ``max_replays`` times is skipped, so a message that keeps failing cannot loop
between the DLQ and the queue for ever.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kmq_dagster.core.durations import format_duration_ms, is_duration, parse_duration_ms
from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    REDELIVERY_COUNT,
    Headers,
    header_value,
    int_header,
)
from kmq_dagster.core.retry_headers import ATTEMPT, DUE_MS, TRACEBACK
from kmq_dagster.errors import ConfigError

#: How many times a message was replayed from a dead-letter topic.
REPLAY_COUNT = "kmq-replay-count"
#: Replays of one message before a replay skips it.
DEFAULT_MAX_REPLAYS = 3

#: Where replayed messages go. ``retry``: back to this group only, on its redelivery topic
#: (processed at once, as the message's second attempt; the name is kept from when the copies
#: went to the first retry topic, which counted them as failures). ``original``: the queue
#: topic, a first attempt, seen by every group consuming it.
TO_RETRY = "retry"
TO_ORIGINAL = "original"
TARGETS = (TO_RETRY, TO_ORIGINAL)
#: Where a target puts the copies, in the words of a replay's report.
TARGET_WORDS = {
    TO_RETRY: "to this group's redelivery topic",
    TO_ORIGINAL: "to the original topic",
}

OffsetRanges = Mapping[int, tuple[tuple[int, int], ...]]


def parse_offsets(text: str) -> dict[int, tuple[tuple[int, int], ...]]:
    """Parse ``"0:10-20,0:25,1:5-"`` into inclusive ranges per partition (``5-``: to the end).

    Raises:
        ConfigError: not of the form ``PARTITION:FIRST[-LAST]``.
    """
    ranges: dict[int, list[tuple[int, int]]] = {}
    for part in (p.strip() for p in text.split(",")):
        partition, sep, span = part.partition(":")
        first, dash, last = span.partition("-")
        try:
            if not sep:
                raise ValueError
            bounds = (int(first), int(last) if last else (2**63 - 1 if dash else int(first)))
            if int(partition) < 0 or bounds[0] < 0 or bounds[1] < bounds[0]:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"offsets are PARTITION:FIRST[-LAST] items separated by commas, "
                f"e.g. 0:10-20,1:5; got {part!r}",
                setting="offsets",
            ) from None
        ranges.setdefault(int(partition), []).append(bounds)
    return {partition: tuple(spans) for partition, spans in ranges.items()}


#: Latest time kmq accepts: the end of year 9999 (Python's datetimes end there).
MAX_TIME_MS = 253_402_300_799_999


@dataclass(frozen=True)
class Ago:
    """A moment given relative to when a replay or discard runs: ``Ago(7_200_000)`` is two
    hours before it starts. It stays relative in the replay's id, so running the same
    command again later resumes the same replay."""

    duration_ms: int

    def __str__(self) -> str:
        return f"{format_duration_ms(self.duration_ms)} ago"


#: A moment: milliseconds since the epoch, or relative to the run.
TimeBound = int | Ago


def parse_time(text: str) -> TimeBound:
    """A point in time: ISO 8601 (``2026-11-23T10:00``, UTC unless an offset is given) or a
    duration before now (``2h`` or ``2h ago``).

    Raises:
        ConfigError: neither form, or outside 1970 to 9999.
    """
    spec = text.strip()
    try:
        moment = datetime.fromisoformat(spec)
    except ValueError:
        relative = spec[: -len(" ago")].rstrip() if spec.lower().endswith(" ago") else spec
        if not is_duration(relative):
            raise ConfigError(
                f"not a time: {text!r} (examples: 2026-11-23T10:00, 2026-11-23T10:00+01:00, "
                "2h, 2h ago)",
                setting="time",
            ) from None
        return Ago(parse_duration_ms(relative))  # a duration too long says so
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment_ms = int(moment.timestamp() * 1000)
    except (OverflowError, ValueError):
        moment_ms = -1
    return _checked_time(moment_ms, text)


def resolve_time(bound: TimeBound, now_ms: int) -> int:
    """``bound`` in milliseconds since the epoch, relative ones counted back from ``now_ms``.

    Raises:
        ConfigError: the moment is before 1970.
    """
    if isinstance(bound, Ago):
        return _checked_time(now_ms - bound.duration_ms, str(bound))
    return bound


def parse_time_ms(text: str, now_ms: int) -> int:
    """:func:`parse_time`, resolved against ``now_ms``."""
    return resolve_time(parse_time(text), now_ms)


def _checked_time(moment_ms: int, text: str) -> int:
    if not 0 <= moment_ms <= MAX_TIME_MS:
        raise ConfigError(f"{text!r} is outside the years 1970 to 9999", setting="time")
    return moment_ms


@dataclass(frozen=True)
class ReplaySelection:
    """Dead letters to replay: every filter given must match (no filter: all of them)."""

    offsets: OffsetRanges = field(default_factory=dict)
    key: bytes | None = None
    error_type: str | None = None
    #: Dead-lettered at or after / before these moments.
    since: TimeBound | None = None
    until: TimeBound | None = None

    def __post_init__(self) -> None:
        since, until = self.since, self.until
        same_kind = isinstance(since, Ago) == isinstance(until, Ago)
        if since is not None and until is not None and same_kind and _at_or_before(until, since):
            raise ConfigError(
                "the start of the time range must come before its end", setting="since"
            )

    def resolved(self, now_ms: int) -> ReplaySelection:
        """This selection with relative moments fixed against ``now_ms``.

        Raises:
            ConfigError: a moment before 1970, or the range is empty.
        """
        return dataclasses.replace(
            self,
            since=None if self.since is None else resolve_time(self.since, now_ms),
            until=None if self.until is None else resolve_time(self.until, now_ms),
        )  # __post_init__ checks the resolved range

    @functools.cached_property
    def _offset_index(self) -> dict[int, tuple[list[int], list[int]]]:
        """Per partition, the offset ranges merged and sorted, as their firsts and their lasts:
        one binary search per dead letter, however many ranges (a console selection has one
        per stretch of selected rows). ``offsets`` itself stays as given: it is in the id."""
        index = {}
        for partition, spans in self.offsets.items():
            merged: list[list[int]] = []
            for first, last in sorted(spans):
                if merged and first <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], last)
                else:
                    merged.append([first, last])
            index[partition] = ([first for first, _ in merged], [last for _, last in merged])
        return index

    def matches(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        headers: Headers | None,
        dead_lettered_ms: int,
    ) -> bool:
        """Whether the dead letter at ``partition``/``offset`` is selected (call on a
        :meth:`resolved` selection)."""
        if self.offsets:
            firsts, lasts = self._offset_index.get(partition, ([], []))
            at = bisect.bisect_right(firsts, offset) - 1
            if at < 0 or offset > lasts[at]:
                return False
        if self.key is not None and key != self.key:
            return False
        wanted_type = self.error_type
        if wanted_type is not None and header_value(headers, ERROR_TYPE) != wanted_type.encode():
            return False
        since, until = self.since, self.until
        assert not isinstance(since, Ago) and not isinstance(until, Ago), "resolve it first"
        if since is not None and dead_lettered_ms < since:
            return False
        return until is None or dead_lettered_ms < until

    def describe(self) -> str:
        """A stable one-line description (also what the default replay id is made from)."""
        parts = []
        if self.offsets:
            spans = ",".join(
                f"{p}:{first}-{last}"
                for p, ranges in sorted(self.offsets.items())
                for first, last in ranges
            )
            parts.append(f"offsets {spans}")
        if self.key is not None:
            parts.append(f"key {self.key!r}")
        if self.error_type is not None:
            parts.append(f"error type {self.error_type}")
        if self.since is not None:
            parts.append(f"since {self.since}")
        if self.until is not None:
            parts.append(f"until {self.until}")
        return "; ".join(parts) or "every dead letter"


def _at_or_before(first: TimeBound, second: TimeBound) -> bool:
    """Whether moment ``first`` is at or before ``second`` (both absolute or both relative)."""
    if isinstance(first, Ago) and isinstance(second, Ago):
        return first.duration_ms >= second.duration_ms
    assert isinstance(first, int) and isinstance(second, int)
    return first <= second


def default_replay_id(topic: str, group: str, selection: ReplaySelection, target: str) -> str:
    """The same replay (queue, group, selection as given, target) always gets the same id, so
    running the same command again resumes it."""
    text = "\n".join((topic, group, selection.describe(), target))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_replay_count(headers: Headers | None) -> int:
    """How many times a dead letter was replayed already; an unreadable count reads as the
    limit's worth, so it is never replayed by accident: callers compare with ``>=``."""
    try:
        return int_header(headers, REPLAY_COUNT) or 0
    except ValueError:
        return 2**31


#: Headers that describe one failed attempt; a replayed copy starts afresh without them.
_ATTEMPT_HEADERS = (ATTEMPT, DUE_MS, DLQ_REASON, REDELIVERY_COUNT)
_ERROR_HEADERS = (ERROR_TYPE, ERROR_MESSAGE, TRACEBACK)


@dataclass(frozen=True)
class ReplayHeaders:
    """What to drop from a dead letter's headers and what to set on its replayed copy."""

    drop: tuple[str, ...]
    updates: Mapping[str, str]


def replay_headers(target: str, replay_count: int, now_ms: int) -> ReplayHeaders:
    """Headers for a copy going back to the group (its redelivery topic: attempt 2, due now,
    no redelivery yet) or back to the original topic (a first attempt). Origin headers are
    kept, so a copy that fails again still names where the message was first produced."""
    count = {REPLAY_COUNT: str(replay_count + 1)}
    if target == TO_RETRY:
        return ReplayHeaders(
            (DLQ_REASON,), {**count, ATTEMPT: "2", DUE_MS: str(now_ms), REDELIVERY_COUNT: "0"}
        )
    return ReplayHeaders(_ATTEMPT_HEADERS + _ERROR_HEADERS, count)
