"""Noticing that a topic a running component needs was deleted under it.

``open_queue`` checks a queue's topics before anything subscribes; this watches them (every
topic of the group, and the queue topic) while the tracker and the worker run. A deleted markers
topic takes the protocol's record of what is in flight with it: a tracker reading it has nothing
left to read, and a worker writing to it would hand out messages whose start markers are never
written (its offsets then stay uncommitted, so nothing is lost, but nothing moves either). Both
stop with a clear error instead of going on without a word.

Every :data:`TOPIC_CHECK_INTERVAL_S` the watch asks for all its topics at once with an admin
client of its own and reads the answer at a later check, so the component's loop never waits
for it. (Asked on the component's consumer, one blocking metadata request per topic took 48 ms
each in a busy worker, about its ``fetch.wait.max.ms``: 8 topics held the loop 0.4 s every
5 s.) A fetch error saying the topic or partition is unknown is checked at once, waiting for
the answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, TopicCollection
from confluent_kafka.admin import AdminClient

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import TopicDeletedError
from kmq_dagster.kafka.clients import kafka_error_of

log = logging.getLogger(__name__)

#: How often a running component checks that its topics still exist.
TOPIC_CHECK_INTERVAL_S = 5.0
#: Longest one check waits for the cluster's answer; no answer is not proof of deletion.
TOPIC_CHECK_TIMEOUT_S = 2.0
#: Error codes that say a topic (or its partition) is gone.
_GONE = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_ID})


def watched_topics(queue: Queue) -> list[str]:
    """What a tracker or worker of ``queue`` cannot work without, the markers topic first:
    the group's topics and the queue topic. (A subscribed topic that is deleted can vanish
    from the assignment without any fetch error, and a deleted dead-letter or retry topic only
    shows when a copy to it fails: each is checked, one metadata request apiece.)"""
    return [queue.markers_topic, queue.topic, *queue.group_topics[1:]]


def means_topic_gone(error: KafkaError) -> bool:
    """Whether ``error`` (a fetch or metadata error) says its topic no longer exists."""
    return error.code() in _GONE


class TopicWatch:
    """Checks, at most every ``interval_s``, that ``topics`` still exist, without waiting.

    Args:
        admin: an admin client of the watch's own (``describe_topics`` answers in the
            background; only the watch uses it).
        topics: the topics the component cannot work without.
        fix: the command that re-creates them, for the error.
        clock_s: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        admin: AdminClient,
        topics: Sequence[str],
        *,
        fix: str,
        interval_s: float = TOPIC_CHECK_INTERVAL_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self.topics = list(topics)
        self._fix = fix
        self._interval_s = interval_s
        self._clock_s = clock_s
        self._checked_at = clock_s()
        #: The answer to the last periodic question, until it is read.
        self._asked: dict[str, Future[Any]] | None = None

    def check_due(self) -> None:
        """Read the answer to the last question if it came; ask again once ``interval_s``
        passed since it was asked. Never waits.

        Raises:
            TopicDeletedError: the answer says one of the topics no longer exists.
        """
        asked = self._asked
        if asked is not None:
            if not all(future.done() for future in asked.values()):
                return
            self._asked = None
            self._judge(asked)
        now_s = self._clock_s()
        if now_s - self._checked_at >= self._interval_s:
            self._checked_at = now_s
            self._asked = self._ask(self.topics)

    def check_now(self, topics: Sequence[str] | None = None) -> None:
        """Check ``topics`` (default: the watched ones) now and wait for the answer (up to
        :data:`TOPIC_CHECK_TIMEOUT_S`): a fetch error said one may be gone, and the metadata
        decides, since a topic just created can be unknown to a broker for a moment.

        Raises:
            TopicDeletedError: one of the topics no longer exists.
        """
        asked = self._ask(self.topics if topics is None else topics)
        futures.wait(list(asked.values()), timeout=TOPIC_CHECK_TIMEOUT_S)
        self._judge(asked)

    def report_gone(self, topic: str) -> None:
        """Raise the error for ``topic`` having been deleted.

        Raises:
            TopicDeletedError: always.
        """
        log.warning("topic %s was deleted while in use; stopping", topic)
        raise TopicDeletedError(
            f"topic {topic} was deleted while in use; re-create it with `{self._fix}`, "
            "then start again"
        )

    def _ask(self, topics: Sequence[str]) -> dict[str, Future[Any]]:
        """One metadata request for all ``topics``; its answer comes as one future each."""
        self._admin.poll(0)  # serve the client's log lines (a connection lost, say)
        return self._admin.describe_topics(
            TopicCollection(list(topics)), request_timeout=TOPIC_CHECK_TIMEOUT_S
        )

    def _judge(self, asked: dict[str, Future[Any]]) -> None:
        """Raise for the first topic the answer says is gone; no answer proves nothing."""
        for topic, answer in asked.items():
            if not answer.done():  # not answered in time: the broker is slow, not the topic gone
                log.debug("metadata of %s not read in time", topic)
                continue
            error = answer.exception()
            if error is None:
                continue
            kafka_error = kafka_error_of(error)
            if kafka_error is not None and means_topic_gone(kafka_error):
                self.report_gone(topic)
            log.debug("metadata of %s not read: %s", topic, error)
