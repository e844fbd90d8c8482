"""Delay queue: any delay from 1 s to 7 days on a ladder of delay-level topics.

A delayed message for topic ``T`` carries its final due time and sits in one level topic
``T.delay.<level>``. The levels are chosen when the delay queue is provisioned
(:data:`DEFAULT_DELAY_LEVELS_MS` unless given, checked by :func:`check_delay_levels`); the
level topics that exist are the ladder, so producers and forwarders read it from the
cluster and need no setting of their own.

Every message of a level topic was put there ``level`` before it may leave (its *hop* time),
so each level topic is in hop-time order and its forwarder waits for the head
only. When a message's hop time comes, the forwarder looks at what remains until its due time:

* nothing: deliver it to ``T``;
* less than the smallest level: hold it in memory until it is due, then deliver it;
* otherwise: move it to the largest level that fits in the remainder (the largest level again
  and again while the remainder is longer than it).

A delay shorter than the smallest level still waits one hop of the smallest level: the
smallest level bounds the precision of short delays (late, never early).

Only a delivery to ``T`` depends on the due time, and it never happens before it (never early).
A hop may be taken a little before its hop time (``HOP_LEAD_MS``): that only shortens the wait
of a message whose final due time still decides when it is delivered.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kmq_dagster.core.durations import format_duration_ms, parse_duration_ms
from kmq_dagster.core.headers import Headers, int_header
from kmq_dagster.core.naming import delay_dlq_topic, delay_levels_of
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.errors import ConfigError, ProvisionError

#: Delay levels of a delay queue provisioned without chosen levels, ascending; one topic each.
DEFAULT_DELAY_LEVELS_MS: tuple[int, ...] = (
    1_000,
    5_000,
    30_000,
    120_000,
    600_000,
    3_600_000,
    21_600_000,
    86_400_000,
)
#: The default ladder under its first name (kept for code written before levels were chosen).
DELAY_LEVELS_MS = DEFAULT_DELAY_LEVELS_MS
MIN_DELAY_MS = 1_000
MAX_DELAY_MS = 7 * 86_400_000
#: Most levels a ladder may have: each is a topic with the queue's partitions.
MAX_DELAY_LEVELS = 16
#: A due time further ahead than this when read is corrupt: the longest delay, plus a day of
#: slack for clocks that differ between the producer and the forwarder.
MAX_DUE_AHEAD_MS = MAX_DELAY_MS + 86_400_000
#: A level topic's message is taken this long before its hop time, so the last stretch to the
#: due time is waited in memory instead of in a fetch round trip.
HOP_LEAD_MS = 250
#: When a message may leave its current level topic (ms since the epoch).
HOP_DUE_MS = "kmq-hop-due-ms"
#: Reason given when a delayed message's headers are missing or unreadable.
CORRUPT_DELAY_METADATA = "corrupt delay metadata"


def delay_queue_missing(topic: str, missing: Sequence[str] = ()) -> str:
    """Why ``topic`` cannot take delayed messages, and the command that fixes it.

    The delay queue is opt-in: a queue provisioned without ``--delays`` has no level topics.

    Args:
        missing: the delay queue's topics that are missing; none: it has no level topic.
    """
    if missing:
        shown = ", ".join(missing[:2]) + (" ..." if len(missing) > 2 else "")
    else:
        shown = f"no level topic {topic}.delay.<level>"
    what = f"{shown} missing" if missing else shown
    return (
        f"{topic} has no delay queue ({what}; it is created only on request): run "
        f"`kmq provision --topic {topic} --delays` (Python: provision_topic(settings, "
        f"{topic!r}, delay_queue=True)) and a `kmq delayer --topic {topic}`"
    )


def check_delay_ms(delay_ms: int) -> int:
    """Return ``delay_ms`` if the delay queue supports it.

    Raises:
        ConfigError: shorter than 1 s or longer than 7 days.
    """
    if not MIN_DELAY_MS <= delay_ms <= MAX_DELAY_MS:
        raise ConfigError(
            f"delay must be between {format_duration_ms(MIN_DELAY_MS)} and "
            f"{format_duration_ms(MAX_DELAY_MS)}, got {delay_ms} ms"
        )
    return delay_ms


def check_delay_levels(levels_ms: Iterable[int]) -> tuple[int, ...]:
    """The levels of a delay ladder, ascending, if they make one.

    Raises:
        ConfigError: none, more than :data:`MAX_DELAY_LEVELS`, one given twice, or one outside
            1 s to 7 days (a longer level is never used: no delay is longer).
    """
    given = list(levels_ms)
    ladder = tuple(sorted(set(given)))
    shown = ",".join(
        format_duration_ms(level_ms) if level_ms >= 0 else f"{level_ms}ms" for level_ms in given
    )
    problem = ""
    if not ladder:
        problem = "give at least one level"
    elif len(ladder) != len(given):
        problem = "a level is given twice"
    elif len(ladder) > MAX_DELAY_LEVELS:
        problem = f"at most {MAX_DELAY_LEVELS} levels"
    elif ladder[0] < MIN_DELAY_MS or ladder[-1] > MAX_DELAY_MS:
        problem = (
            f"each level must be between {format_duration_ms(MIN_DELAY_MS)} and "
            f"{format_duration_ms(MAX_DELAY_MS)}"
        )
    if problem:
        raise ConfigError(
            f"delay levels are a comma-separated list of distinct durations, e.g. 1s,30s,5m,1h: "
            f"{problem} (got {shown or 'none'})",
            setting="delay_levels",
        )
    return ladder


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``"1s,30s,5m,1h"`` as a checked ladder (:func:`check_delay_levels`), in ms.

    Raises:
        ConfigError: a part is not a duration, or the levels make no ladder.
    """
    parts = [part.strip() for part in text.split(",")]
    try:
        levels_ms = [parse_duration_ms(part) for part in parts if part]
    except ConfigError as exc:
        raise ConfigError(f"delay levels: {exc}", setting="delay_levels") from None
    if len(levels_ms) != len(parts):
        raise ConfigError(
            f"delay levels are a comma-separated list of durations, e.g. 1s,30s,5m,1h "
            f"(got {text!r})",
            setting="delay_levels",
        )
    return check_delay_levels(levels_ms)


def found_ladder(topic: str, names: Collection[str]) -> tuple[int, ...]:
    """The ladder of ``topic``'s delay queue: the levels whose topics are among ``names`` (the
    cluster's topics), as provisioning created them.

    Raises:
        ProvisionError: no level topic or no delay DLQ (the delay queue was not provisioned),
            or the level topics make no ladder.
    """
    levels_ms = delay_levels_of(topic, names)
    if not levels_ms:
        raise ProvisionError(delay_queue_missing(topic))
    if delay_dlq_topic(topic) not in names:
        raise ProvisionError(delay_queue_missing(topic, [delay_dlq_topic(topic)]))
    try:
        return check_delay_levels(levels_ms)
    except ConfigError as exc:
        raise ProvisionError(f"the level topics of {topic} make no delay ladder: {exc}") from None


def ladder_to_provision(
    topic: str, names: Collection[str], levels_ms: Iterable[int] | None
) -> tuple[int, ...]:
    """The ladder provisioning ``topic``'s delay queue creates or keeps.

    Args:
        names: the cluster's topics.
        levels_ms: the levels asked for; ``None``: the existing ladder, else the default.

    Raises:
        ConfigError: ``levels_ms`` make no ladder.
        ProvisionError: the topic has a ladder of other levels. A ladder is never changed in
            place: a level topic may hold messages only its own level delivers, so removing
            one could strand them, and adding one would change the ladder without saying so.
    """
    given = None if levels_ms is None else check_delay_levels(levels_ms)
    found = delay_levels_of(topic, names)
    if not found:
        return given or DEFAULT_DELAY_LEVELS_MS
    if given is not None and given != found:
        raise ProvisionError(
            f"{topic} has a delay queue with levels {_levels_text(found)}, not "
            f"{_levels_text(given)}; kmq does not change a delay ladder (omit the levels to keep "
            f"it; to change it, let `kmq delayer --topic {topic}` empty its level topics, delete "
            f"them and {delay_dlq_topic(topic)}, and provision again)"
        )
    return found


def _levels_text(levels_ms: Iterable[int]) -> str:
    return ",".join(format_duration_ms(level_ms) for level_ms in levels_ms)


def level_for(remaining_ms: int, levels_ms: Sequence[int]) -> int:
    """The largest of ``levels_ms`` (ascending) not longer than ``remaining_ms``; the smallest
    if none is."""
    fitting = [level for level in levels_ms if level <= remaining_ms]
    return fitting[-1] if fitting else levels_ms[0]


@dataclass(frozen=True)
class Deliver:
    """Due now: produce the message to the queue topic."""


@dataclass(frozen=True)
class Hold:
    """Due within the smallest level: keep it in memory and deliver it at ``until_ms``."""

    until_ms: int


@dataclass(frozen=True)
class Hop:
    """Move the message to level ``level_ms``, to leave it at ``hop_due_ms``."""

    level_ms: int
    hop_due_ms: int


def enqueue(due_ms: int, now_ms: int, levels_ms: Sequence[int]) -> Hop:
    """Where a message delayed until ``due_ms`` goes first, on the ladder ``levels_ms``
    (ascending, as :func:`check_delay_levels` returns it)."""
    level_ms = level_for(due_ms - now_ms, levels_ms)
    return Hop(level_ms, now_ms + level_ms)


def next_step(due_ms: int, now_ms: int, levels_ms: Sequence[int]) -> Deliver | Hold | Hop:
    """What to do with a message taken from a level topic of the ladder ``levels_ms`` at
    ``now_ms``."""
    remaining_ms = due_ms - now_ms
    if remaining_ms <= 0:
        return Deliver()
    if remaining_ms < levels_ms[0]:
        return Hold(due_ms)
    return enqueue(due_ms, now_ms, levels_ms)


def delay_headers(step: Hop, due_ms: int) -> Mapping[str, str]:
    """The ``kmq-*`` headers of a message put on a level topic."""
    return {DUE_MS: str(due_ms), HOP_DUE_MS: str(step.hop_due_ms)}


@dataclass(frozen=True)
class DelayTimes:
    """The times a level topic's message carries."""

    due_ms: int
    hop_due_ms: int


def read_delay_times(headers: Headers | None, now_ms: int) -> DelayTimes:
    """The due and hop times of a message read from a level topic.

    Raises:
        ValueError: a header is missing or unreadable, or the due time is further ahead than
            any delay allows (``CORRUPT_DELAY_METADATA`` belongs in front of the message).
    """
    due_ms = int_header(headers, DUE_MS)
    hop_due_ms = int_header(headers, HOP_DUE_MS)
    if due_ms is None or hop_due_ms is None:
        raise ValueError(f"{DUE_MS} or {HOP_DUE_MS} missing")
    if due_ms - now_ms > MAX_DUE_AHEAD_MS:
        raise ValueError(f"due time {due_ms} is more than {format_duration_ms(MAX_DELAY_MS)} ahead")
    return DelayTimes(due_ms, hop_due_ms)
