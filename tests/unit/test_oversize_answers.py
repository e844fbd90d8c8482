"""A broker that refuses a copy for its size in its answer (Apache Kafka's 1 MB default; the
embedded broker has no limit): the retry router and the tracker dead-letter a reference, and
acknowledge or end the message only once the reference is acknowledged (issue 34, item 2)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kmq_dagster.core.headers import DLQ_REASON
from kmq_dagster.core.inflight import MessageRef
from kmq_dagster.core.oversize import OVERSIZE_BYTES, VALUE_REF
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.kafka import redelivery
from kmq_dagster.kafka.opened_queue import vouch_for
from kmq_dagster.kafka.record_reader import ReadResult
from kmq_dagster.kafka.redelivery import Redeliverer
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.kafka.tracker_state import MarkersPartitionState, TrackerStats
from kmq_dagster.settings import KmqSettings
from tests.unit.fakes import FakeClock, FakeProducer, FakeRecord, message

NOWHERE = KmqSettings(bootstrap_servers="127.0.0.1:1")
QUEUE = Queue("orders", "billing", partitions=1, retry_policy=RetryPolicy.fixed([5_000]))
#: The broker's limit in these tests, on a record's value.
LIMIT_BYTES = 1_000
BIG = b"x" * 2_000


class SizeLimitedBroker(FakeProducer):
    """Answers MSG_SIZE_TOO_LARGE for a record whose value is over :data:`LIMIT_BYTES`, as a
    broker does after the client let it through; deliveries to ``failing_topics`` time out."""

    def flush(self, _timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for record, report in pending:
            too_large = len(record.value or b"") > LIMIT_BYTES
            failed = record.topic in self.failing_topics
            if not (too_large or failed):
                self.delivered.append(record)
            error = (
                KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if too_large
                else KafkaError(KafkaError._MSG_TIMED_OUT) if failed
                else None
            )  # fmt: skip
            if report is not None:  # a delivery report carries the record as produced
                report(error, FakeRecord(record.topic, record.partition or 0, 0, record.value,
                                         record.key, record.headers))  # fmt: skip
        return 0


def route(broker: SizeLimitedBroker) -> list[int]:
    router = RetryRouter(vouch_for(NOWHERE, QUEUE), clock_ms=FakeClock(), rng=random.Random(1),
                         producer=broker)  # type: ignore[arg-type]  # fmt: skip
    failed = [(message("orders", 5, BIG), Failure("ValueError", "no")),
              (message("orders", 6, b"ok"), Failure("ValueError", "no"))]  # fmt: skip
    return [m.offset for m in router.route(failed)]


def test_a_retry_copy_the_broker_refuses_for_its_size_is_dead_lettered_as_a_reference() -> None:
    broker = SizeLimitedBroker()
    assert route(broker) == [5, 6]
    (reference,) = broker.to(QUEUE.dlq_topic)
    assert reference.value == b"" and reference.header(VALUE_REF) == b"orders/0/5"
    assert int(reference.header(OVERSIZE_BYTES) or 0) >= len(BIG)
    assert b"refused for orders.billing.retry.5s" in (reference.header(DLQ_REASON) or b"")
    assert [r.value for r in broker.to("orders.billing.retry.5s")] == [b"ok"]


def test_a_message_whose_reference_is_not_acknowledged_is_not_acknowledged_either() -> None:
    broker = SizeLimitedBroker(failing_topics={QUEUE.dlq_topic})
    assert route(broker) == [6]


class OneRecordReader:
    def __init__(self, *_args: Any) -> None:
        pass

    def read(self, topic: str, partition: int, offsets: list[int], *_: Any) -> ReadResult:
        return ReadResult(found={o: FakeRecord(topic, partition, o, BIG) for o in offsets})  # type: ignore[misc]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("dlq_answers", [True, False])
def test_a_redelivery_the_broker_refuses_for_its_size_ends_only_after_its_reference(
    monkeypatch: pytest.MonkeyPatch, dlq_answers: bool
) -> None:
    broker = SizeLimitedBroker(failing_topics=set() if dlq_answers else {QUEUE.dlq_topic})
    monkeypatch.setattr(redelivery, "new_producer", lambda _settings: broker)
    monkeypatch.setattr(redelivery, "RecordReader", OneRecordReader)
    stats = TrackerStats()
    redeliverer = Redeliverer(NOWHERE, QUEUE, stats)

    ended = redeliverer.redeliver(0, MarkersPartitionState(), [MessageRef("orders", 0, 5)])

    references = broker.to(QUEUE.dlq_topic)
    assert broker.to(QUEUE.redelivery_topic) == []
    if dlq_answers:
        assert ended == 1 and [r.header(VALUE_REF) for r in references] == [b"orders/0/5"]
        assert (stats.oversize, stats.dead_lettered, stats.redelivered) == (1, 1, 0)
    else:  # nothing ended: the message stays in flight and is tried again
        assert ended == 0 and references == []
