"""A running component notices that a topic it needs was deleted, from its client's metadata,
and is not fooled by a broker that does not answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kmq_dagster.errors import TopicDeletedError
from kmq_dagster.kafka.topic_watch import TopicWatch, means_topic_gone


@dataclass
class TopicMetadata:
    error: KafkaError | None = None


@dataclass
class Metadata:
    topics: dict[str, TopicMetadata] = field(default_factory=dict)


class MetadataConsumer:
    """Answers metadata requests from a set of existing topics (or not at all)."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing
        self.answering = True
        self.requests: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> Metadata:
        self.requests.append(topic)
        if not self.answering:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        if topic in self.existing:
            return Metadata({topic: TopicMetadata()})
        return Metadata({topic: TopicMetadata(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))})


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def watch(consumer: Any, clock: FakeClock) -> TopicWatch:
    return TopicWatch(
        consumer, ["q", "q.g.markers"], fix="kmq provision --topic q --group g", clock_s=clock
    )


def test_a_deleted_topic_is_reported_at_the_next_due_check_with_the_fix() -> None:
    # given a watch over two topics that both exist
    consumer, clock = MetadataConsumer({"q", "q.g.markers"}), FakeClock()
    watched = watch(consumer, clock)
    clock.now_s = 5
    watched.check_due()
    # when the markers topic is deleted
    consumer.existing.discard("q.g.markers")
    clock.now_s = 6
    watched.check_due()  # not due yet: no request
    assert consumer.requests == ["q", "q.g.markers"]
    clock.now_s = 10
    # then the next due check raises, naming the topic and the fix
    with pytest.raises(TopicDeletedError, match=r"q\.g\.markers was deleted.*kmq provision"):
        watched.check_due()


def test_a_broker_that_does_not_answer_is_not_a_deleted_topic() -> None:
    consumer, clock = MetadataConsumer(set()), FakeClock()
    consumer.answering = False
    watched = watch(consumer, clock)

    watched.check_now()

    assert consumer.requests == ["q"]  # gave up at the first unanswered request


def test_only_unknown_topic_errors_mean_gone() -> None:
    assert means_topic_gone(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert means_topic_gone(KafkaError(KafkaError.UNKNOWN_TOPIC_ID))
    assert not means_topic_gone(KafkaError(KafkaError._TRANSPORT))


def test_a_fetch_error_checks_the_topic_it_names_at_once() -> None:
    consumer, clock = MetadataConsumer({"q.g.markers"}), FakeClock()
    watched = watch(consumer, clock)

    with pytest.raises(TopicDeletedError, match=r"topic q was deleted"):
        watched.check_now(["q"])

    assert consumer.requests == ["q"]
