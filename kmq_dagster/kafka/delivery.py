"""The one way kmq produces: back-pressure when the local queue is full, delivery reports per
record, and a bounded wait for the broker's acknowledgement.

Markers, redelivered, retried, dead-lettered, replayed and delayed copies all go through
:func:`produce`; code that must know a record is durable before it acts (acknowledging the
original, committing an offset) collects its records in a :class:`Deliveries` and waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from kmq_dagster.errors import DeliveryError

#: Longest kmq waits for the broker to acknowledge what it produced before it gives up (the
#: records stay unacknowledged, so nothing is marked done: the work is tried again).
DELIVERY_TIMEOUT_S = 30.0
#: Longest kmq waits for the broker's answer about a copy whose original is acknowledged only
#: once the copy is durable (a retry, a dead letter, a redelivery). Longer than a broker restart
#: or a stall: giving up early would leave the copy queued in the client, to be written anyway,
#: while the original is handed out again (a duplicate, and a redelivery spent on the broker's
#: fault). librdkafka answers every record within its ``message.timeout.ms`` (300 s).
COPY_ANSWER_TIMEOUT_S = 120.0
#: How long to serve delivery reports before trying again when the local queue is full.
BACKPRESSURE_POLL_S = 0.05

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def produce(
    producer: Producer,
    topic: str,
    *,
    value: bytes | str | None,
    key: bytes | str | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    partition: int | None = None,
    on_delivery: DeliveryCallback | None = None,
) -> None:
    """Produce one record; while the producer's local queue is full, serve its delivery
    reports and try again, so a fast caller is slowed down instead of failing."""
    fields: dict[str, Any] = {"value": value, "key": key, "on_delivery": on_delivery}
    if headers:
        fields["headers"] = headers
    if partition is not None:
        fields["partition"] = partition
    while True:
        try:
            producer.produce(topic, **fields)
            return
        except BufferError:
            producer.poll(BACKPRESSURE_POLL_S)


class Deliveries:
    """Records produced together whose acknowledgements are awaited together.

    Examples:
        >>> deliveries = Deliveries(producer)                        # doctest: +SKIP
        >>> index = deliveries.produce("orders.billing.dlq", value=b"...", partition=0)
        >>> deliveries.wait().delivered                              # doctest: +SKIP
        {0}
    """

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._count = 0
        self.delivered: set[int] = set()
        #: Where each delivered record was written: (topic, partition, offset) by index.
        self.written: dict[int, tuple[str, int, int]] = {}
        self.failed: dict[int, KafkaError] = {}

    def produce(self, topic: str, **fields: Any) -> int:
        """Produce one record (fields as :func:`produce` takes them); returns its index."""
        index = self._count
        self._count += 1

        def report(error: KafkaError | None, record: Message) -> None:
            if error is None:
                self.delivered.add(index)
                self.written[index] = (record.topic() or "", record.partition() or 0,
                                       record.offset() or 0)  # fmt: skip
            else:
                self.failed[index] = error

        produce(self._producer, topic, on_delivery=report, **fields)
        return index

    def __len__(self) -> int:
        return self._count

    def wait(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> Deliveries:
        """Wait until every record is acknowledged or failed, or ``timeout_s`` passed; records
        without an answer by then count as neither delivered nor failed."""
        self._producer.flush(timeout_s)
        return self

    def wait_all(self, what: str, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Wait for every record, and raise unless the broker acknowledged them all.

        Raises:
            DeliveryError: some records failed or were not answered in time.
        """
        self.wait(timeout_s)
        missing = self._count - len(self.delivered)
        if missing:
            first = next(iter(self.failed.values())).str() if self.failed else "no answer"
            raise DeliveryError(
                f"{missing} of {self._count} {what} were not acknowledged by Kafka within "
                f"{timeout_s:g} s ({first})"
            )


class DeliveryTally:
    """Like :class:`Deliveries` when only *whether* all were acknowledged matters: one shared
    callback instead of one per record (a tracker copies up to a whole backlog chunk at once).
    """

    def __init__(self, producer: Producer, on_error: DeliveryCallback | None = None) -> None:
        """``on_error``, if given, gets each refused record's answer (the same callable for
        every record: nothing is kept per record)."""
        self._producer = producer
        self._on_error = on_error
        self.produced = 0
        self.delivered = 0
        #: The first few errors, for the log.
        self.errors: list[KafkaError] = []

    def produce(
        self, topic: str, on_delivery: DeliveryCallback | None = None, **fields: Any
    ) -> None:
        """Produce one record through :func:`produce` (fields as it takes them);
        ``on_delivery``, if given, gets the broker's answer too."""
        report = self._report if on_delivery is None else self._reporting_to(on_delivery)
        produce(self._producer, topic, on_delivery=report, **fields)
        # Counted once queued: a record the client refused at once (it raised) has no answer.
        self.produced += 1

    def _reporting_to(self, on_delivery: DeliveryCallback) -> DeliveryCallback:
        def report(error: KafkaError | None, record: Message) -> None:
            self._report(error, record)
            on_delivery(error, record)

        return report

    def _report(self, error: KafkaError | None, record: Message) -> None:
        if error is None:
            self.delivered += 1
            return
        if len(self.errors) < 3:
            self.errors.append(error)
        if self._on_error is not None:
            self._on_error(error, record)

    def all_delivered(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> bool:
        """Wait up to ``timeout_s`` for the answers; True if the broker acknowledged every
        record produced."""
        self._producer.flush(timeout_s)
        return self.delivered == self.produced
