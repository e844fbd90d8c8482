"""Acknowledgements become end markers at a poll, but a busy worker's poll (one that does not
wait) writes them only once the last flush is ``ACK_FLUSH_GAP_S`` old, so its acks go out in
runs rather than one marker per message; a poll about to wait never leaves them behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kmq_dagster.core.handouts import HandoutLedger
from kmq_dagster.core.markers import EndMarker, decode_marker
from kmq_dagster.kafka.ack_flusher import ACK_FLUSH_GAP_S, AckFlusher
from kmq_dagster.kafka.consumer_stats import ConsumerStats
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.settings import KmqSettings
from tests.unit.fakes import FakeProducer, FakeRecord, FakeSecondsClock

MARKERS = "orders.billing.markers"


class Flushing:
    """An ack flusher over a fake producer and a fake clock, with messages handed out."""

    def __init__(self) -> None:
        self.clock = FakeSecondsClock(100.0)
        self.producer = FakeProducer()
        self.handouts: HandoutLedger[FakeRecord] = HandoutLedger()
        writer = MarkerWriter(KmqSettings(), MARKERS, producer=self.producer)  # type: ignore[arg-type]
        self.flusher = AckFlusher(
            writer, self.handouts, ConsumerStats(), thread_name="test-acks",  # type: ignore[arg-type]
            clock_s=self.clock,
        )  # fmt: skip

    def handed_out(self, offset: int) -> FakeRecord:
        record = FakeRecord("orders", 0, offset)
        self.handouts.record([record], [(("orders", 0), offset, 1)])
        return record

    def ack(self, offset: int) -> None:
        self.flusher.acks.append(self.handed_out(offset))  # type: ignore[arg-type]

    def end_markers(self) -> list[EndMarker]:
        self.producer.flush()
        written = [decode_marker(r.value or b"") for r in self.producer.to(MARKERS)]
        return [m for m in written if isinstance(m, EndMarker)]


@pytest.fixture
def flushing() -> Iterator[Flushing]:
    made = Flushing()
    yield made
    made.flusher.stop()


def test_a_busy_poll_leaves_acks_for_a_later_one_until_the_gap_has_passed(
    flushing: Flushing,
) -> None:
    # given an ack just after a flush
    flushing.flusher.flush()
    flushing.ack(7)

    # when a poll that does not wait comes within the gap, then nothing is written yet
    flushing.flusher.flush_before_poll(waiting=False)
    assert flushing.end_markers() == []

    # but the next ack and a poll once the gap has passed write both
    flushing.ack(8)
    flushing.clock.now_s += ACK_FLUSH_GAP_S * 1.01  # past it, whatever the float rounding
    flushing.flusher.flush_before_poll(waiting=False)
    assert flushing.end_markers() == [EndMarker("orders", 0, 7, 1), EndMarker("orders", 0, 8, 1)]
    assert flushing.flusher.acks == []


def test_a_poll_about_to_wait_writes_every_ack_first(flushing: Flushing) -> None:
    flushing.flusher.flush()
    flushing.ack(7)

    flushing.flusher.flush_before_poll(waiting=True)

    assert flushing.end_markers() == [EndMarker("orders", 0, 7, 1)]
