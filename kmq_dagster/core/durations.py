"""Human durations ("90s", "5m", "1h30m", "7d") to milliseconds and back.

Every duration is bounded at parse time by :data:`MAX_DURATION_MS`, so a deadline computed from
one (``now + duration``) always fits where kmq stores it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kmq_dagster.errors import ConfigError

#: Milliseconds per unit, largest first (formatting picks the largest exact unit).
UNIT_MS: dict[str, int] = {
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}

#: Longest duration kmq accepts: 100 years (``36500d``). Every deadline kmq computes is a clock
#: reading plus a duration; for any clock before the year 9800 that sum is a valid ``datetime``
#: and lies far inside the signed 64-bit deadline of a start marker (``core/markers.py``).
MAX_DURATION_MS = 36_500 * UNIT_MS["d"]
#: Digits of the longest count that can still be within :data:`MAX_DURATION_MS` (in ms).
_MAX_COUNT_DIGITS = len(str(MAX_DURATION_MS))

#: A whole duration: one or more counts with a unit (a bare count is normalized to seconds).
_FORM = re.compile(r"(?:\d+(?:ms|d|h|m|s))+", re.ASCII)
_PART = re.compile(r"(\d+)(ms|d|h|m|s)", re.ASCII)


def is_duration(text: str) -> bool:
    """Whether ``text`` is written as a duration (``90s``, ``1h30m``, ``45``), however long."""
    return _FORM.fullmatch(_normalized(text)) is not None


def parse_duration_ms(text: str) -> int:
    """Parse a duration such as ``"90s"``, ``"5m"``, ``"1h30m"`` or ``"250ms"``.

    A bare number is taken as seconds.

    Raises:
        ConfigError: the text is not a duration, or it is longer than :data:`MAX_DURATION_MS`.
    """
    spec = _normalized(text)
    if _FORM.fullmatch(spec) is None:
        raise ConfigError(f"not a duration: {text!r} (examples: 500ms, 90s, 5m, 1h30m, 7d)")
    total_ms = 0
    for count, unit in _PART.findall(spec):
        digits = count.lstrip("0")
        if len(digits) > _MAX_COUNT_DIGITS:  # too long in any unit; spares int() a huge text
            raise _too_long(text)
        total_ms += int(digits or "0") * UNIT_MS[unit]
    if total_ms > MAX_DURATION_MS:
        raise _too_long(text)
    return total_ms


def _normalized(text: str) -> str:
    spec = text.strip().lower()
    return spec + "s" if spec.isascii() and spec.isdigit() else spec


def _too_long(text: str) -> ConfigError:
    longest = format_duration_ms(MAX_DURATION_MS)
    return ConfigError(f"duration {text[:40]!r} is too long: kmq accepts at most {longest}")


def format_duration_ms(duration_ms: int) -> str:
    """Format milliseconds as the shortest exact form, e.g. ``300000 -> "5m"``.

    Up to :data:`MAX_DURATION_MS` the result parses back to the same value; it is always safe
    in a Kafka topic name.

    Raises:
        ConfigError: ``duration_ms`` is negative.
    """
    if duration_ms < 0:
        raise ConfigError(f"negative duration: {duration_ms} ms")
    if duration_ms == 0:
        return "0s"
    parts: list[str] = []
    remaining_ms = duration_ms
    for unit, unit_ms in UNIT_MS.items():
        count, remaining_ms = divmod(remaining_ms, unit_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def seconds_from_env(
    env: Mapping[str, str], name: str, default: float, *, zero_allowed: bool = False
) -> float:
    """The environment variable ``name`` as seconds, ``default`` when it is unset: a finite
    number above 0 (from 0 with ``zero_allowed``); anything else is a :class:`ConfigError`
    naming the variable."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not (seconds >= 0 if zero_allowed else seconds > 0) or seconds == float("inf"):
        wanted = "a number of seconds >= 0" if zero_allowed else "a positive number of seconds"
        raise ConfigError(f"{name} must be {wanted}, got {raw!r}", setting=name)
    return seconds
