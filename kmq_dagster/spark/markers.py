"""Start and end markers from Spark: one producer per process, written without waiting per
chunk, and waited for once before anyone relies on them.

Executors and the driver both write markers (start markers and the end markers of routed
failures on the executors, the end markers of a committed batch on the driver). Spark reuses
its Python workers, and an idempotent producer spends ~0.5 s getting its producer id (measured
on the embedded broker), so each process keeps one producer per configuration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kmq_dagster.core.markers import EndMarker, StartMarker, encode_marker
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import Deliveries
from kmq_dagster.settings import KmqSettings

_PRODUCERS: dict[str, Any] = {}


def _producer(settings: KmqSettings) -> Any:
    key = json.dumps(settings.producer_config(), sort_keys=True, default=str)
    if key not in _PRODUCERS:
        _PRODUCERS[key] = new_producer(settings)
    return _PRODUCERS[key]


class MarkerWriter:
    """Writes one queue's markers; :meth:`wait` says whether all of them are durable."""

    def __init__(self, settings: KmqSettings, markers_topic: str) -> None:
        self._producer = _producer(settings)
        self._deliveries = Deliveries(self._producer)
        self._topic = markers_topic
        self.written = 0

    def write(self, markers: Sequence[StartMarker | EndMarker]) -> None:
        """Send ``markers`` (in order, per queue partition) without waiting for the broker."""
        for marker in markers:
            self._deliveries.produce(
                self._topic, value=encode_marker(marker), partition=marker.partition
            )
        self.written += len(markers)

    def wait(self) -> None:
        """Wait until the broker has every marker written so far.

        Raises:
            DeliveryError: a marker was not written. Markers are idempotent facts: Spark
                retries the task, or the driver its batch's acknowledgement, and writing them
                twice is harmless.
        """
        waiting, self._deliveries = self._deliveries, Deliveries(self._producer)
        waiting.wait_all("markers")


def extend_runs(runs: list[tuple[int, int]], more: list[tuple[int, int]]) -> None:
    """Append ascending ``(first offset, count)`` runs to ``runs``; runs that continue each
    other are merged, so a partition read without gaps stays one run."""
    for first, count in more:
        if runs and sum(runs[-1]) == first:
            runs[-1] = (runs[-1][0], runs[-1][1] + count)
        else:
            runs.append((first, count))


def merge_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(first offset, count)`` runs in ascending order, those that continue each other merged."""
    merged: list[tuple[int, int]] = []
    extend_runs(merged, runs)
    return merged


def end_markers(topic: str, partition: int, runs: list[tuple[int, int]]) -> list[EndMarker]:
    """End markers for ``(first offset, count)`` runs of one partition, in ascending order."""
    return [EndMarker(topic, partition, first, count) for first, count in merge_runs(runs)]
