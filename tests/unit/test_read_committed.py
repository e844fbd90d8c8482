"""Committed offsets are read, never guessed: an error for a partition is not "none committed"
(a replay or a Spark job would start that partition over from its beginning)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, TopicPartition

from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.kafka.group_offsets import read_committed

SOURCES = [("orders.dlq", 0), ("orders.dlq", 1)]


@dataclass
class Answer:
    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


class Coordinator:
    """A consumer whose group coordinator gives these answers in turn (the last one again)."""

    def __init__(self, *answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Answer]:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


LOADING = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)


def test_a_partition_answered_with_an_error_is_asked_again() -> None:
    # given a coordinator still loading the group's offsets of partition 1, then answering
    coordinator = Coordinator(
        [Answer("orders.dlq", 0, 700), Answer("orders.dlq", 1, -1001, LOADING)],
        [Answer("orders.dlq", 0, 700), Answer("orders.dlq", 1, 650)],
    )

    # when the committed offsets are read
    found = read_committed(coordinator, SOURCES, timeout_s=30)  # type: ignore[arg-type]

    # then partition 1's is its committed one, not "none"
    assert found == {("orders.dlq", 0): 700, ("orders.dlq", 1): 650}
    assert coordinator.asked == 2


def test_an_error_that_lasts_raises_instead_of_reading_as_nothing_committed() -> None:
    coordinator = Coordinator(
        [Answer("orders.dlq", 0, 700), Answer("orders.dlq", 1, -1001, LOADING)]
    )

    with pytest.raises(KafkaUnavailableError, match=r"orders\.dlq\[1\]"):
        read_committed(coordinator, SOURCES, timeout_s=1)  # type: ignore[arg-type]


def test_a_partition_without_a_commit_reads_as_none() -> None:
    coordinator = Coordinator([Answer("orders.dlq", 0, 700), Answer("orders.dlq", 1, -1001)])

    found = read_committed(coordinator, SOURCES, timeout_s=30)  # type: ignore[arg-type]

    assert found == {("orders.dlq", 0): 700, ("orders.dlq", 1): None}
