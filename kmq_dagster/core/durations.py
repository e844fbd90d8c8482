"""Human durations ("90s", "5m", "1h30m", "7d") to milliseconds and back."""

from __future__ import annotations

import re

from kmq_dagster.errors import ConfigError

#: Milliseconds per unit, largest first (formatting picks the largest exact unit).
UNIT_MS: dict[str, int] = {
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}

_PART = re.compile(r"(\d+)(ms|d|h|m|s)")


def parse_duration_ms(text: str) -> int:
    """Parse a duration such as ``"90s"``, ``"5m"``, ``"1h30m"`` or ``"250ms"``.

    A bare number is taken as seconds.

    Raises:
        ConfigError: the text is not a duration.
    """
    spec = text.strip().lower()
    if spec.isdigit():
        return int(spec) * UNIT_MS["s"]
    total_ms = 0
    position = 0
    for match in _PART.finditer(spec):
        if match.start() != position:
            break
        total_ms += int(match.group(1)) * UNIT_MS[match.group(2)]
        position = match.end()
    if not spec or position != len(spec):
        raise ConfigError(f"not a duration: {text!r} (examples: 500ms, 90s, 5m, 1h30m, 7d)")
    return total_ms


def format_duration_ms(duration_ms: int) -> str:
    """Format milliseconds as the shortest exact form, e.g. ``300000 -> "5m"``.

    The result parses back to the same value and is safe in a Kafka topic name.
    """
    if duration_ms < 0:
        raise ValueError(f"negative duration: {duration_ms} ms")
    if duration_ms == 0:
        return "0s"
    parts: list[str] = []
    remaining_ms = duration_ms
    for unit, unit_ms in UNIT_MS.items():
        count, remaining_ms = divmod(remaining_ms, unit_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
