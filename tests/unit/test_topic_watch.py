"""A running component notices that a topic it needs was deleted, from the cluster's metadata,
without its loop ever waiting for the answer, and is not fooled by a broker that does not
answer."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection

from kmq_dagster.errors import TopicDeletedError
from kmq_dagster.kafka.topic_watch import TopicWatch, means_topic_gone
from tests.unit.fakes import FakeSecondsClock


class MetadataAdmin:
    """Answers ``describe_topics`` from a set of existing topics; while ``holding``, the
    answers wait until :meth:`answer` is called (a slow broker)."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing
        self.holding = False
        self.answering = True
        self.requests: list[list[str]] = []
        self._held: list[tuple[Future[Any], str]] = []

    def describe_topics(self, topics: TopicCollection, request_timeout: float) -> dict[str, Any]:
        names = list(topics.topic_names)
        self.requests.append(names)
        asked: dict[str, Future[Any]] = {name: Future() for name in names}
        for name, future in asked.items():
            if self.holding:
                self._held.append((future, name))
            else:
                self._settle(future, name)
        return asked

    def poll(self, timeout: float) -> int:
        return 0

    def answer(self) -> None:
        for future, name in self._held:
            self._settle(future, name)
        self._held.clear()

    def _settle(self, future: Future[Any], name: str) -> None:
        if not self.answering:
            future.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
        elif name in self.existing:
            future.set_result(object())
        else:
            future.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))


def watch(admin: Any, clock: FakeSecondsClock) -> TopicWatch:
    return TopicWatch(
        admin, ["q", "q.g.markers"], fix="kmq provision --topic q --group g", clock_s=clock
    )


def test_a_deleted_topic_is_reported_once_the_answer_to_a_due_check_came_with_the_fix() -> None:
    # given a watch over two topics that both exist
    admin, clock = MetadataAdmin({"q", "q.g.markers"}), FakeSecondsClock()
    watched = watch(admin, clock)
    clock.now_s = 5
    watched.check_due()  # asks (one request for both topics)
    watched.check_due()  # reads the answer: both there
    # when the markers topic is deleted
    admin.existing.discard("q.g.markers")
    clock.now_s = 6
    watched.check_due()  # not due yet: no request
    assert admin.requests == [["q", "q.g.markers"]]
    clock.now_s = 10
    watched.check_due()  # asks
    # then the check after the answer raises, naming the topic and the fix
    with pytest.raises(TopicDeletedError, match=r"q\.g\.markers was deleted.*kmq provision"):
        watched.check_due()


def test_the_loop_never_waits_for_an_answer_and_asks_nothing_more_until_it_came() -> None:
    # given a broker slow to answer, and the markers topic deleted
    admin, clock = MetadataAdmin({"q"}), FakeSecondsClock()
    admin.holding = True
    watched = watch(admin, clock)
    clock.now_s = 5
    watched.check_due()
    # when checks come while the answer has not: they return at once, and ask nothing more
    clock.now_s = 11
    watched.check_due()
    watched.check_due()
    assert admin.requests == [["q", "q.g.markers"]]
    # then the first check after the answer raises
    admin.answer()
    with pytest.raises(TopicDeletedError, match=r"q\.g\.markers was deleted"):
        watched.check_due()


def test_a_broker_that_does_not_answer_is_not_a_deleted_topic() -> None:
    admin, clock = MetadataAdmin(set()), FakeSecondsClock()
    admin.answering = False
    watched = watch(admin, clock)

    watched.check_now()
    clock.now_s = 5
    watched.check_due()
    watched.check_due()

    assert admin.requests == [["q", "q.g.markers"], ["q", "q.g.markers"]]


def test_only_unknown_topic_errors_mean_gone() -> None:
    assert means_topic_gone(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert means_topic_gone(KafkaError(KafkaError.UNKNOWN_TOPIC_ID))
    assert not means_topic_gone(KafkaError(KafkaError._TRANSPORT))


def test_a_fetch_error_checks_the_topic_it_names_at_once() -> None:
    admin, clock = MetadataAdmin({"q.g.markers"}), FakeSecondsClock()
    watched = watch(admin, clock)

    with pytest.raises(TopicDeletedError, match=r"topic q was deleted"):
        watched.check_now(["q"])

    assert admin.requests == [["q"]]
