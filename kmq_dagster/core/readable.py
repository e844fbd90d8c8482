"""Figures as a person on call reads them: rates to sensible precision, ages as rounded
durations, shares as percentages, and chart buckets sized to the window shown.

The console's Overview, the Dagster sensors' tick messages and ``kmq demo --ui`` all format
through here, so one figure reads the same everywhere. Every function takes ``None`` for "not
known / nothing to measure" and shows it as :data:`NOTHING`, never as ``None``.

Examples:
    >>> rate_text(3.8183), duration_text(72_400), percent_text(1.0), duration_text(None)
    ('3.8 /s', '1m 12s', '100%', '-')
    >>> arrival_bucket_s(3_600), arrival_bucket_s(7 * 86_400)
    (60, 3600)
"""

from __future__ import annotations

#: What an unknown or absent figure shows as (nothing in flight, no snapshot yet).
NOTHING = "-"

#: Units of a rounded duration, largest first: (name, milliseconds).
_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))

#: Bucket sizes an arrivals chart may use (seconds): each a whole number of the next smaller,
#: so bucket edges fall on round clock times.
BUCKET_SIZES_S = (60, 300, 600, 1_800, 3_600, 10_800, 21_600, 43_200, 86_400)
#: Most bars an arrivals chart shows across its window (7 days of hours).
MAX_BUCKETS = 168


def duration_text(duration_ms: int | float | None) -> str:
    """A duration rounded to its two largest units: ``"850 ms"``, ``"42s"``, ``"1m 12s"``,
    ``"2h 5m"``, ``"3d 4h"``; :data:`NOTHING` for ``None``."""
    if duration_ms is None:
        return NOTHING
    if duration_ms < 0:
        return "-" + duration_text(-duration_ms)
    if round(duration_ms) < 1_000:
        return f"{duration_ms:.0f} ms"
    remaining = round(duration_ms / 1_000) * 1_000  # whole seconds
    parts: list[str] = []
    for unit, unit_ms in _UNITS_MS:
        count, remaining = divmod(remaining, unit_ms)
        if count or parts:
            parts.append(f"{count:.0f}{unit}")
        if len(parts) == 2:
            break
    if len(parts) == 2 and parts[1].startswith("0"):
        parts.pop()  # "2h" rather than "2h 0m"
    return " ".join(parts)


def rate_text(per_s: float | None) -> str:
    """A rate with the digits that matter: ``"0.38 /s"``, ``"3.8 /s"``, ``"180 /s"``,
    ``"12,345 /s"``; :data:`NOTHING` for ``None``."""
    if per_s is None:
        return NOTHING
    if per_s == 0:
        return "0 /s"
    if per_s < 1:
        return f"{per_s:.2g} /s"
    if round(per_s, 1) < 100:
        return f"{per_s:.1f} /s"
    return f"{per_s:,.0f} /s"


def percent_text(fraction: float | None) -> str:
    """A share (0..1) as a percentage: ``"100%"``, ``"2%"``, ``"0.4%"`` (small shares keep a
    decimal, so a few failures never read as 0% and a few successes never as 100%);
    :data:`NOTHING` for ``None``."""
    if fraction is None:
        return NOTHING
    percent = fraction * 100
    if 0 < percent < 1 or 99 < percent < 100:
        return f"{min(max(percent, 0.1), 99.9):.1f}%"
    return f"{percent:.0f}%"


def state_text(state: str) -> str:
    """A breaker state as people read it everywhere: ``half-open`` (the code's ``half_open``)."""
    return state.replace("_", "-")


def arrival_bucket_s(window_s: int) -> int:
    """The bucket of a chart over ``window_s`` seconds: the smallest of
    :data:`BUCKET_SIZES_S` that draws at most :data:`MAX_BUCKETS` bars (1 hour: minutes,
    24 hours: 10 minutes, 7 days: hours)."""
    for size_s in BUCKET_SIZES_S:
        if window_s <= size_s * MAX_BUCKETS:
            return size_s
    return BUCKET_SIZES_S[-1]


def bucket_starts_s(since_s: int, until_s: int, bucket_s: int) -> list[int]:
    """Start (epoch seconds) of every bucket from the one holding ``since_s`` to the one holding
    ``until_s``: a chart gets a bar (0 if empty) for each, so it spans the whole window."""
    first = since_s // bucket_s * bucket_s
    return list(range(first, until_s + 1, bucket_s))


def bucket_label(bucket_s: int) -> str:
    """The axis title of a chart bucketed by ``bucket_s``, e.g. ``"per 10m (UTC, bar = its
    start)"``."""
    return f"per {duration_text(bucket_s * 1_000)} (UTC, bar = its start)"
