"""Delay queue: any delay from 1 s to 7 days on a fixed ladder of delay-level topics.

A delayed message for topic ``T`` carries its final due time and sits in one level topic
``T.delay.<level>``. Every message of a level topic was put there ``level`` before it may leave
(its *hop* time), so each level topic is in hop-time order and its forwarder waits for the head
only. When a message's hop time comes, the forwarder looks at what remains until its due time:

* nothing: deliver it to ``T``;
* less than the smallest level: hold it in memory until it is due, then deliver it;
* otherwise: move it to the largest level that fits in the remainder.

Only a delivery to ``T`` depends on the due time, and it never happens before it (never early).
A hop may be taken a little before its hop time (``HOP_LEAD_MS``): that only shortens the wait
of a message whose final due time still decides when it is delivered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.headers import Headers, int_header
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.errors import ConfigError

#: Delay levels, ascending; one topic each per queue topic.
DELAY_LEVELS_MS: tuple[int, ...] = (
    1_000,
    5_000,
    30_000,
    120_000,
    600_000,
    3_600_000,
    21_600_000,
    86_400_000,
)
MIN_DELAY_MS = 1_000
MAX_DELAY_MS = 7 * 86_400_000
#: A level topic's message is taken this long before its hop time, so the last stretch to the
#: due time is waited in memory instead of in a fetch round trip.
HOP_LEAD_MS = 250
#: When a message may leave its current level topic (ms since the epoch).
HOP_DUE_MS = "kmq-hop-due-ms"
#: Reason given when a delayed message's headers are missing or unreadable.
CORRUPT_DELAY_METADATA = "corrupt delay metadata"


def delay_queue_missing(topic: str, missing: list[str]) -> str:
    """Why ``topic`` cannot take delayed messages, and the command that fixes it.

    The delay queue is opt-in: a queue provisioned without ``--delays`` has no level topics.
    """
    shown = ", ".join(missing[:2]) + (" ..." if len(missing) > 2 else "")
    return (
        f"{topic} has no delay queue ({shown} missing; it is created only on request): run "
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


def level_for(remaining_ms: int) -> int:
    """The largest delay level not longer than ``remaining_ms`` (at least the smallest)."""
    fitting = [level for level in DELAY_LEVELS_MS if level <= remaining_ms]
    return fitting[-1] if fitting else DELAY_LEVELS_MS[0]


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


def enqueue(due_ms: int, now_ms: int) -> Hop:
    """Where a message delayed until ``due_ms`` goes first."""
    level_ms = level_for(due_ms - now_ms)
    return Hop(level_ms, now_ms + level_ms)


def next_step(due_ms: int, now_ms: int) -> Deliver | Hold | Hop:
    """What to do with a message taken from a level topic at ``now_ms``."""
    remaining_ms = due_ms - now_ms
    if remaining_ms <= 0:
        return Deliver()
    if remaining_ms < DELAY_LEVELS_MS[0]:
        return Hold(due_ms)
    return enqueue(due_ms, now_ms)


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
    if due_ms - now_ms > MAX_DELAY_MS + DELAY_LEVELS_MS[-1]:
        raise ValueError(f"due time {due_ms} is more than {format_duration_ms(MAX_DELAY_MS)} ahead")
    return DelayTimes(due_ms, hop_due_ms)
