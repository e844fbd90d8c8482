"""Click value types that check a command-line value as it is parsed: a ``Duration`` in
milliseconds within a range, a finite ``Number`` within bounds, a ``Moment`` in time.

A bad value fails with click's usage error, naming the option, before the command runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click
from click.decorators import FC

from kmq_dagster.core.durations import format_duration_ms, parse_duration_ms
from kmq_dagster.core.queue_settings import MAX_VISIBILITY_TIMEOUT_MS
from kmq_dagster.core.replay import TimeBound, parse_time
from kmq_dagster.errors import ConfigError


class Duration(click.ParamType[int, Any]):
    """A duration such as ``90s`` or ``1h30m``, as milliseconds within a range."""

    name = "duration"

    def __init__(self, *, min_ms: int = 1, max_ms: int = MAX_VISIBILITY_TIMEOUT_MS) -> None:
        self.min_ms = min_ms
        self.max_ms = max_ms

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            duration_ms = parse_duration_ms(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        if not self.min_ms <= duration_ms <= self.max_ms:
            low, high = format_duration_ms(self.min_ms), format_duration_ms(self.max_ms)
            self.fail(f"{value!r} is outside {low} to {high}", param, ctx)
        return duration_ms


def duration_option(
    name: str,
    default: str,
    help: str,
    *,
    min_ms: int = 1,
    max_ms: int = MAX_VISIBILITY_TIMEOUT_MS,
) -> Callable[[FC], FC]:
    """An option taking a :class:`Duration` from ``min_ms`` to ``max_ms``, ``default`` shown."""
    return click.option(
        name,
        type=Duration(min_ms=min_ms, max_ms=max_ms),
        default=default,
        show_default=True,
        metavar="DURATION",
        help=help,
    )


class Number(click.ParamType[float, Any]):
    """A finite number within ``[low, high]`` (``high`` excluded when ``high_open``)."""

    name = "number"

    def __init__(
        self, low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
    ) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.low if self.low_open else number >= self.low
        high_ok = number < self.high if self.high_open else number <= self.high
        if not math.isfinite(number) or not (low_ok and high_ok):
            low = "(" if self.low_open else "["
            high = ")" if self.high_open else "]"
            self.fail(f"{value!r} is not in {low}{self.low:g}, {self.high:g}{high}", param, ctx)
        return number


class Moment(click.ParamType[TimeBound, Any]):
    """A point in time: ISO 8601 or a duration ago (``2h``, ``2h ago``)."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> TimeBound:
        try:
            return parse_time(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
