"""Noticing that a topic a running component needs was deleted under it.

``open_queue`` checks a queue's topics before anything subscribes; this watches them (every
topic of the group, and the queue topic) while the tracker and the worker run. A deleted markers
topic takes the protocol's record of what is in flight with it: a tracker reading it has nothing
left to read, and a worker writing to it would hand out messages whose start markers are never
written (its offsets then stay uncommitted, so nothing is lost, but nothing moves either). Both
stop with a clear error instead of going on without a word.

The check asks the component's own client for the topic's metadata every
:data:`TOPIC_CHECK_INTERVAL_S`, and a fetch error saying the topic or partition is unknown
counts at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import TopicDeletedError

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
    """Checks, at most every ``interval_s``, that ``topics`` still exist.

    Args:
        consumer: the component's own consumer (its metadata requests are cheap).
        topics: the topics the component cannot work without.
        fix: the command that re-creates them, for the error.
        clock_s: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        consumer: Consumer,
        topics: Sequence[str],
        *,
        fix: str,
        interval_s: float = TOPIC_CHECK_INTERVAL_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self.topics = list(topics)
        self._fix = fix
        self._interval_s = interval_s
        self._clock_s = clock_s
        self._checked_at = clock_s()

    def check_due(self) -> None:
        """Check the topics if the last check is ``interval_s`` old.

        Raises:
            TopicDeletedError: one of the topics no longer exists.
        """
        if self._clock_s() - self._checked_at >= self._interval_s:
            self.check_now()

    def check_now(self, topics: Sequence[str] | None = None) -> None:
        """Check ``topics`` (default: the watched ones) now: a fetch error said one may be
        gone, and the metadata decides, since a topic just created can be unknown to a broker
        for a moment.

        Raises:
            TopicDeletedError: one of the topics no longer exists.
        """
        if topics is None:
            self._checked_at = self._clock_s()
        for topic in self.topics if topics is None else topics:
            try:
                metadata = self._consumer.list_topics(topic, timeout=TOPIC_CHECK_TIMEOUT_S)
            except KafkaException as exc:  # no answer: the broker is down, not the topic gone
                log.debug("metadata of %s not read: %s", topic, exc)
                return  # nor wait for the others: a stop request must not wait on them
            found = metadata.topics.get(topic)
            if found is None or (found.error is not None and means_topic_gone(found.error)):
                self.report_gone(topic)

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
