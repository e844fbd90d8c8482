"""A consumer group's offsets: where it has got to (read without joining it), and moving a
member's offsets as a :class:`~kmq_dagster.core.commits.CommitQueue` decided."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kmq_dagster.core.commits import ReadyOffsets
from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.kafka.clients import CLIENT_LOGGER, kafka_error_text
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)


#: Pause between two reads of committed offsets while the group's coordinator answers with
#: an error for some partition (it is moving, or loading the group's offsets).
COMMITTED_RETRY_S = 0.2


def read_committed(
    consumer: Consumer, partitions: Sequence[tuple[str, int]], timeout_s: float
) -> dict[tuple[str, int], int | None]:
    """``consumer``'s group's committed offset on each (topic, partition); ``None`` where the
    group has none.

    A partition the coordinator answers with an error for is asked again until ``timeout_s``
    has passed; it is never read as "nothing committed" (a replay or a Spark job would start
    that partition over from its beginning).

    Raises:
        KafkaUnavailableError: no answer, or still an error for some partition, within
            ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left_s = max(0.001, deadline - time.monotonic())
        try:
            found = consumer.committed(
                [TopicPartition(topic, partition) for topic, partition in partitions],
                timeout=left_s,
            )
        except KafkaException as exc:
            problem = kafka_error_text(exc)
        else:
            failed = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in found if tp.error]
            if not failed:
                return {
                    (tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found
                }
            problem = "; ".join(failed)
        if time.monotonic() + COMMITTED_RETRY_S >= deadline:
            raise KafkaUnavailableError(f"cannot read committed offsets: {problem}")
        log.info("committed offsets not read yet (%s); asking again", problem)
        time.sleep(COMMITTED_RETRY_S)


def committed_offsets(
    settings: KmqSettings, group: str, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int | None]:
    """``group``'s committed offset on each (topic, partition); ``None`` where it has none.

    The consumer used never subscribes, so the group is not rebalanced.

    Raises:
        KafkaUnavailableError: the broker did not answer within the request timeout.
    """
    if not partitions:
        return {}
    consumer = Consumer(settings.consumer_config(group, logger=CLIENT_LOGGER))
    try:
        return read_committed(consumer, partitions, settings.request_timeout_ms / 1000)
    except KafkaUnavailableError as exc:
        raise KafkaUnavailableError(
            f"group {group} at {settings.bootstrap_servers}: {exc}"
        ) from exc
    finally:
        consumer.close()


def apply_ready_offsets(
    consumer: Consumer, ready: ReadyOffsets, *, asynchronous: bool = True
) -> KafkaException | None:
    """Carry out what a :class:`~kmq_dagster.core.commits.CommitQueue` decided: seek each
    partition to rewind back to its first offset not yet safe, then commit the offsets that
    are. Returns the commit's error (the caller says what it may duplicate), else ``None``."""
    for (topic, partition), offset in ready.rewind.items():
        try:
            consumer.seek(TopicPartition(topic, partition, offset))
        except KafkaException as exc:
            # Not assigned any more: its new owner starts from the committed offset.
            log.warning("could not rewind %s[%d]: %s", topic, partition, exc)
    if not ready.commit:
        return None
    offsets = [TopicPartition(t, p, offset) for (t, p), offset in ready.commit.items()]
    try:
        if asynchronous:  # two calls: the client's type stubs overload on the literal
            consumer.commit(offsets=offsets, asynchronous=True)
        else:
            consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:
        return exc
    return None
