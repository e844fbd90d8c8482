"""Never early on a consumer: a partition stops at its first message not yet due, is rewound
there and paused, and resumes when that message is due (fake consumer, fixed clock)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from kmq_dagster.kafka.due_gate import DueGate

NOW_MS = 1_800_000_000_000
RETRY = "orders.billing.retry.5s"


class PausingConsumer:
    """What DueGate does to a confluent-kafka consumer, recorded."""

    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()
        self.positions: dict[tuple[str, int], int] = {}

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, position: TopicPartition) -> None:
        self.positions[(position.topic, position.partition)] = position.offset


def test_a_partition_stops_at_its_first_message_not_due_and_resumes_exactly_when_it_is() -> None:
    # given a retry partition whose third message is due 4 s from now, and another partition
    consumer = PausingConsumer()
    gate = DueGate(consumer)  # type: ignore[arg-type]
    due = {10: NOW_MS - 5, 11: NOW_MS, 12: NOW_MS + 4_000, 13: NOW_MS - 100}
    batches = {(RETRY, 0): [10, 11, 12, 13], (RETRY, 1): [7]}

    # when the batch is held back
    ready = gate.hold_back(batches, NOW_MS, due.get, lambda o: o)

    # then what is due (at the due time, not only before it) passes; 12 and what follows waits
    assert sorted(ready) == [7, 10, 11]
    assert consumer.paused == {(RETRY, 0)}
    assert consumer.positions == {(RETRY, 0): 12}  # re-read from the waiting message
    assert gate.next_resume_ms() == NOW_MS + 4_000

    gate.resume_due(NOW_MS + 3_999)  # a millisecond early: still paused
    assert consumer.paused == {(RETRY, 0)} and gate.is_paused((RETRY, 0))
    gate.resume_due(NOW_MS + 4_000)
    assert consumer.paused == set() and gate.next_resume_ms() is None


def test_a_revoked_partition_is_forgotten() -> None:
    consumer = PausingConsumer()
    gate = DueGate(consumer)  # type: ignore[arg-type]
    gate.hold_back({(RETRY, 0): [1]}, NOW_MS, lambda _: NOW_MS + 1, lambda o: o)

    gate.forget([(RETRY, 0)])

    assert not gate.is_paused((RETRY, 0)) and gate.next_resume_ms() is None
