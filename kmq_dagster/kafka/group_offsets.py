"""A consumer group's offsets: where it has got to (read without joining it), and moving a
member's offsets as a :class:`~kmq_dagster.core.commits.CommitQueue` decided."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kmq_dagster.core.commits import ReadyOffsets
from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.kafka.clients import CLIENT_LOGGER
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)


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
        found = consumer.committed(
            [TopicPartition(topic, partition) for topic, partition in partitions],
            timeout=settings.request_timeout_ms / 1000,
        )
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read the committed offsets of {group} at {settings.bootstrap_servers}: "
            f"{exc.args[0].str() if exc.args else exc}"
        ) from exc
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}


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
