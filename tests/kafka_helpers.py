"""Test helpers that talk to the real broker: produce, read whole topics, run a tracker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.naming import dlq_topic
from kmq_dagster.core.replay import REPLAY_COUNT
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.kafka.topic_reader import records_and_ends
from kmq_dagster.kafka.worker import run_worker
from kmq_dagster.settings import KmqSettings


def produce(
    settings: KmqSettings,
    topic: str,
    values: list[bytes],
    *,
    partitions: int = 1,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Produce ``values`` round-robin over ``partitions``, keyed by index, and wait for acks."""
    producer = Producer(settings.producer_config())
    for i, value in enumerate(values):
        producer.produce(
            topic, key=str(i).encode(), value=value, partition=i % partitions, headers=headers
        )
    assert producer.flush(30) == 0


def read_topic(
    settings: KmqSettings, topic: str, partitions: int, *, at_least: int = 0, timeout_s: float = 30
) -> list[Message]:
    """Every record of ``topic`` from the start, without a group; waits for ``at_least``."""
    consumer = Consumer(
        settings.consumer_config(f"reader-{uuid.uuid4().hex}", **{"enable.partition.eof": True})
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Message] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            records += records_and_ends(consumer.consume(500, 0.2), at_end)
            if len(at_end) == partitions and len(records) >= at_least:
                break
        return records
    finally:
        consumer.close()


class Service(Protocol):
    def run(self, stop: threading.Event) -> None: ...


S = TypeVar("S", bound=Service)


@contextmanager
def running_service(service: S) -> Iterator[S]:
    """Run ``service`` (a tracker, a delay forwarder) on a thread for the duration of the
    block; stop it and wait."""
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield service
    finally:
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), f"{type(service).__name__} did not stop"


def wait_for(
    condition: Callable[[], object], timeout_s: float = 30, interval_s: float = 0.1
) -> bool:
    """Poll ``condition()`` until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


@contextmanager
def running_worker(
    settings: KmqSettings,
    topic: str,
    group: str,
    handler: Callable[[KmqMessage], object],
    policy: RetryPolicy,
) -> Iterator[RetryRouter]:
    """Run a worker (consumer, retry router, ``handler``) on a thread for the block."""
    router = RetryRouter(settings, topic, group, policy, clock_ms=wall_clock_ms)
    consumer = KmqConsumer(settings, topic, group, retry_topics=list(router.retry_topics.values()))
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(consumer, handler, stop, None, router))
    thread.start()
    try:
        yield router
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop"


def produce_dead_letters(
    settings: KmqSettings,
    topic: str,
    group: str,
    items: list[tuple[str, str]],
    *,
    partitions: int,
    replayed: int = 0,
) -> None:
    """Put (key, error type) dead letters in ``group``'s DLQ as the retry router writes them."""
    producer = Producer(settings.producer_config())
    for index, (key, error_type) in enumerate(items):
        partition = index % partitions
        origin = Origin(topic, partition, 1_000 + index, 1_700_000_000_000)
        updates = copy_headers(
            origin, group, Failure(error_type, "boom"), attempt=2, dlq_reason="failed 2 attempts"
        )
        extra = {REPLAY_COUNT: str(replayed)} if replayed else {}
        producer.produce(
            dlq_topic(topic, group),
            key=key,
            value=f"value-{key}",
            partition=partition,
            headers=[*replace_headers([("trace", b"t-" + key.encode())], {**updates, **extra})],
        )
    assert producer.flush(30) == 0
