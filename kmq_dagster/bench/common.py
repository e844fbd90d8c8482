"""What every ``kmq bench`` shares: where to report, which Kafka to use, percentiles."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from kmq_dagster.settings import KmqSettings

#: Prints one progress line (to stderr: stdout's last line is the JSON figures).
Report = Callable[[str], None]
#: Gives the Kafka to measure on, for the length of one measurement.
Cluster = Callable[[], AbstractContextManager[KmqSettings]]


def percentile(values: list[float], share: float) -> float:
    """The value below which ``share`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
