"""The one marker path: start and end markers per offset run, and whether they are durable."""

from __future__ import annotations

import pytest

from kmq_dagster.core.markers import EndMarker, StartMarker, decode_marker
from kmq_dagster.errors import DeliveryError
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.settings import KmqSettings
from tests.unit.fakes import FakeProducer

MARKERS = "orders.billing.markers"


def writer_over(producer: FakeProducer) -> MarkerWriter:
    return MarkerWriter(KmqSettings(), MARKERS, producer=producer)  # type: ignore[arg-type]


def test_start_and_end_markers_go_one_per_run_to_their_partition() -> None:
    # given a writer
    producer = FakeProducer()
    writer = writer_over(producer)

    # when a batch of two partitions starts, and part of it ends
    writer.start([(("orders", 0), 100, 50), (("orders", 2), 7, 1)], deadline_ms=5_000)
    writer.end([(("orders", 0), 100, 20)])
    writer.wait()

    # then one marker per run, in the partition of its messages
    written = [(r.partition, decode_marker(r.value or b"")) for r in producer.to(MARKERS)]
    assert written == [
        (0, StartMarker("orders", 0, 100, 50, 5_000)),
        (2, StartMarker("orders", 2, 7, 1, 5_000)),
        (0, EndMarker("orders", 0, 100, 20)),
    ]


def test_the_tracker_writes_end_markers_where_it_read_the_start() -> None:
    producer = FakeProducer()

    writer_over(producer).end([(("orders.billing.redelivery", 1), 4, 2)], markers_partition=3)

    producer.flush()
    assert [r.partition for r in producer.to(MARKERS)] == [3]


def test_each_start_marker_reports_its_answer_to_the_caller() -> None:
    # given a writer whose markers the broker refuses
    answers: list[bool] = []
    writer = writer_over(FakeProducer(failing_topics={MARKERS}))

    # when a batch of two runs starts
    writer.start(
        [(("orders", 0), 0, 3), (("orders", 1), 0, 3)], 1, lambda e, _r: answers.append(e is None)
    )
    writer.serve()

    # then the caller heard of each failure (the consumer rewinds instead of committing)
    assert answers == [False, False]


def test_wait_raises_unless_every_marker_since_the_last_wait_is_durable() -> None:
    # given a marker the broker refuses
    producer = FakeProducer(failing_topics={MARKERS})
    writer = writer_over(producer)
    writer.start([(("orders", 0), 0, 1)], deadline_ms=1)

    # then waiting says so
    with pytest.raises(DeliveryError, match="1 of 1 markers"):
        writer.wait()

    # and once the broker takes markers again, the next wait is about the new ones only
    producer.failing_topics.clear()
    writer.end([(("orders", 0), 0, 1)])
    writer.wait()
