"""Sending to a queue, now or after a delay (``send(topic, value, delay=90)``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from confluent_kafka import KafkaError, Message

from kmq_dagster.core.delay import check_delay_ms, delay_headers, enqueue, found_ladder
from kmq_dagster.core.headers import RawHeaders, normalize_headers, replace_headers
from kmq_dagster.core.naming import delay_topic, validate_topic_name
from kmq_dagster.errors import ProvisionError
from kmq_dagster.kafka.clients import cluster_metadata, new_producer, wall_clock_ms
from kmq_dagster.kafka.delivery import DELIVERY_TIMEOUT_S, produce
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import sent_headers, tracing_active

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def delay_to_ms(delay: float | timedelta) -> int:
    """Seconds (or a ``timedelta``) as whole milliseconds, checked against the supported range.

    Raises:
        ConfigError: shorter than 1 s or longer than 7 days.
    """
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    return check_delay_ms(round(seconds * 1000))


class KmqProducer:
    """Produce to queue topics; a delayed message is delivered when due, never before.

    Delayed messages travel through the queue's delay-level topics, which are created only on
    request (``kmq provision --topic T --delays``, ``provision_topic(..., delay_queue=True)``),
    and need a delay forwarder (``kmq delayer --topic T``) running for the topic. The levels
    are read from the level topics that exist, once per topic: whatever levels the delay queue
    was provisioned with, the producer needs no setting of its own.

    Examples:
        >>> producer = KmqProducer(settings)                              # doctest: +SKIP
        >>> producer.send("orders", b'{"id": 1}', key=b"1", delay=90)    # doctest: +SKIP
        >>> producer.flush()                                              # doctest: +SKIP
    """

    def __init__(self, settings: KmqSettings, *, clock_ms: Callable[[], int] = wall_clock_ms):
        self._settings = settings
        self._clock_ms = clock_ms
        self._producer = new_producer(settings)
        self._checked_topics: set[str] = set()
        #: The delay ladder of each topic sent to with a delay, read once from the cluster.
        self._ladders: dict[str, tuple[int, ...]] = {}

    def send(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        headers: RawHeaders | None = None,
        delay: float | timedelta | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Produce one message to ``topic``, or after ``delay`` seconds (1 s to 7 days).

        Asynchronous: call :meth:`flush` to wait for the broker, or pass ``on_delivery``.

        Raises:
            ConfigError: the topic name is illegal or the delay is out of range.
            ProvisionError: ``topic`` does not exist (producing would create it with the
                broker's defaults), or ``delay`` is given and the topic has no delay-level
                topics (nothing is sent; run ``kmq provision --topic T --delays``).
        """
        pairs = normalize_headers(headers)
        target = topic
        self._require_topic(topic)
        if delay is not None:
            delay_ms = delay_to_ms(delay)
            levels_ms = self._ladder(topic)
            now_ms = self._clock_ms()
            due_ms = now_ms + delay_ms
            first_hop = enqueue(due_ms, now_ms, levels_ms)
            target = delay_topic(topic, first_hop.level_ms)
            pairs = replace_headers(pairs, delay_headers(first_hop, due_ms))
        if tracing_active():
            pairs = sent_headers(topic, pairs)
        produce(
            self._producer, target, value=value, key=key, headers=[*pairs], on_delivery=on_delivery
        )
        self._producer.poll(0)

    def flush(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> int:
        """Wait for every sent message to be acknowledged; returns how many are still pending."""
        return int(self._producer.flush(timeout_s))

    def _require_topic(self, topic: str) -> None:
        if topic in self._checked_topics:
            return
        validate_topic_name(topic)
        if topic not in cluster_metadata(self._settings).topics:
            raise ProvisionError(
                f"topic {topic} does not exist; create it with `kmq provision --topic {topic} "
                "--partitions N`"
            )
        self._checked_topics.add(topic)

    def delay_levels_ms(self, topic: str) -> tuple[int, ...]:
        """The levels of ``topic``'s delay ladder (ms, ascending), as its level topics on the
        cluster say; read once per topic. A delay shorter than the first waits that long.

        Raises:
            ProvisionError: ``topic`` has no delay queue.
        """
        return self._ladder(topic)

    def _ladder(self, topic: str) -> tuple[int, ...]:
        """``topic``'s delay levels, as its level topics on the cluster say (ProvisionError:
        it has no delay queue)."""
        if topic not in self._ladders:
            self._ladders[topic] = found_ladder(topic, cluster_metadata(self._settings).topics)
        return self._ladders[topic]
