"""Where a consumer group has got to: its committed offsets, read without joining it."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.kafka.clients import CLIENT_LOGGER
from kmq_dagster.settings import KmqSettings


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
