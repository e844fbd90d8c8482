"""Writing start and end markers: the one marker path of the consumer side of the protocol.

:class:`KmqConsumer`, the :class:`RedeliveryTracker`, the Spark tasks and the Spark driver all
write their markers here (steps 2 and 4 of docs/design.md, "The protocol", and the end
markers of step 7): one marker per offset run, never per message, produced without waiting.
Whoever relies on the markers being durable learns it in one of two ways: per marker, through
``on_delivery`` (the consumer commits a batch's offsets once every start marker of it is
acknowledged, invariant 2), or all at once, through :meth:`MarkerWriter.wait` (a Spark task
before it reports its offsets, the driver before it commits them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from confluent_kafka import Producer

from kmq_dagster.core.markers import EndMarker, StartMarker, encode_marker
from kmq_dagster.core.ranges import OffsetRun
from kmq_dagster.errors import DeliveryError
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S, DeliveryCallback, DeliveryTally
from kmq_dagster.settings import KmqSettings

__all__ = ["MarkerWriter", "process_producer"]

_PRODUCERS: dict[str, Producer] = {}


def process_producer(settings: KmqSettings) -> Producer:
    """This process's producer for ``settings``, made on first use.

    Spark reuses its Python workers, and an idempotent producer spends ~0.5 s getting its
    producer id (measured on the embedded broker), so each executor process keeps one.
    """
    key = json.dumps(settings.producer_config(), sort_keys=True, default=str)
    if key not in _PRODUCERS:
        _PRODUCERS[key] = new_producer(settings)
    return _PRODUCERS[key]


class MarkerWriter:
    """Writes one queue's markers: start markers with a deadline, end markers, per offset run.

    Args:
        producer: writes the markers; default this process's shared producer
            (:func:`process_producer`).

    Examples:
        >>> writer = MarkerWriter(settings, queue.markers_topic)            # doctest: +SKIP
        >>> writer.start([(("orders", 0), 100, 500)], deadline_ms)          # doctest: +SKIP
        >>> writer.wait()   # raises DeliveryError unless all are durable   # doctest: +SKIP
    """

    def __init__(
        self, settings: KmqSettings, markers_topic: str, *, producer: Producer | None = None
    ) -> None:
        self.producer = process_producer(settings) if producer is None else producer
        self.markers_topic = markers_topic
        #: Markers written since the last :meth:`wait`. Counted without a lock: only a writer
        #: used from one thread (a Spark task, the driver) waits on it.
        self._tally = DeliveryTally(self.producer)

    def start(
        self,
        runs: Iterable[OffsetRun],
        deadline_ms: int,
        on_delivery: DeliveryCallback | None = None,
    ) -> list[StartMarker]:
        """Send a start marker per run: its messages are in flight until ``deadline_ms``.

        Args:
            deadline_ms: when the tracker redelivers the messages unless they are acknowledged
                or extended (ms since the epoch).
            on_delivery: called with the broker's answer for each marker (from the thread that
                serves the producer's delivery reports).

        Returns:
            The markers sent.
        """
        markers = [
            StartMarker(topic, partition, first, count, deadline_ms)
            for (topic, partition), first, count in runs
        ]
        for marker in markers:
            self._tally.produce(
                self.markers_topic,
                on_delivery,
                value=encode_marker(marker),
                partition=marker.partition,
            )
        return markers

    def end(
        self, runs: Iterable[OffsetRun], markers_partition: int | None = None
    ) -> list[EndMarker]:
        """Send an end marker per run: its messages are acknowledged, never redelivered.

        Args:
            markers_partition: the markers partition to write to; default each message's own
                partition number (the tracker writes an end where it read the start).

        Returns:
            The markers sent.
        """
        markers = [
            EndMarker(topic, partition, first, count) for (topic, partition), first, count in runs
        ]
        for marker in markers:
            self._tally.produce(
                self.markers_topic,
                value=encode_marker(marker),
                partition=marker.partition if markers_partition is None else markers_partition,
            )
        return markers

    def serve(self) -> None:
        """Serve the producer's delivery reports that have arrived, without waiting."""
        self.producer.poll(0)

    def flush(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Wait up to ``timeout_s`` for the broker's answers to every marker sent."""
        self.producer.flush(timeout_s)

    def wait(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Wait until the broker has every marker written since the last wait.

        Raises:
            DeliveryError: a marker was not written. Markers are idempotent facts: Spark
                retries the task, or the driver its batch's acknowledgement, and writing them
                twice is harmless.
        """
        waiting, self._tally = self._tally, DeliveryTally(self.producer)
        if waiting.all_delivered(timeout_s):
            return
        missing = waiting.produced - waiting.delivered
        first = waiting.errors[0].str() if waiting.errors else "no answer"
        raise DeliveryError(
            f"{missing} of {waiting.produced} markers were not acknowledged by Kafka within "
            f"{timeout_s:g} s ({first})"
        )
