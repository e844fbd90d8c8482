"""Test helpers that talk to the real broker: produce, read whole topics, run a tracker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from confluent_kafka import Message, Producer

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import REPLAY_COUNT
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.kafka.topic_reader import assigned_reader, records_and_ends
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.mock_cluster import MOCK_PARTITIONS, mock_selected


def new_queue(
    settings: KmqSettings,
    topic: str,
    group: str | None = None,
    *,
    partitions: int = 1,
    retry_delays_ms: tuple[int, ...] = (10_000, 60_000, 600_000),
    delay_queue: bool = False,
    **definition: Any,
) -> OpenedQueue:
    """Provision a queue (retry delays, visibility timeout, max redeliveries as given) and
    return it opened, in ``group`` (by default the test's own, :func:`group_of` the topic).
    On the mock cluster every topic has its fixed partition count."""
    if mock_selected():  # every topic, auxiliary ones too, gets the mock's fixed count
        partitions = MOCK_PARTITIONS
        definition["aux_partitions"] = MOCK_PARTITIONS
    queue = Queue(
        topic,
        group_of(topic) if group is None else group,
        partitions=partitions,
        retry_policy=RetryPolicy.fixed(retry_delays_ms),
        **definition,
    )
    return provision_queue(settings, queue, delay_queue=delay_queue).opened


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
    """Every record of ``topic`` from the start, without a group: read until every partition
    reported its end with at least ``at_least`` records read, or ``timeout_s`` passed.

    ``partitions`` is the count to read when the topic does not exist yet; an existing topic
    is read in all its partitions (a queue's auxiliary topics may have fewer than the queue).
    """
    deadline = time.monotonic() + timeout_s
    existing = partition_counts(settings)
    partitions = existing.get(topic, partitions)
    consumer = assigned_reader(settings, topic, dict.fromkeys(range(partitions), 0))
    records: list[Message] = []
    # A partition is at its end after its EOF event, until a record of it follows (then its
    # next EOF event puts it back): records arriving later are waited for, not the timeout.
    at_end: set[int] = set()
    try:
        while time.monotonic() < deadline:
            records += records_and_ends(consumer.consume(1_000, 0.1), at_end)
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


def group_of(topic: str) -> str:
    """The test's own consumer group. Tests on one broker never share a group: a group spans
    topics, so a worker SIGKILLed during a rebalance stalled the next test's worker in a shared
    group for minutes (nothing handled for 180 s, in a loaded CI run)."""
    return f"proof-{topic.rsplit('-', 1)[-1]}"


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


#: The longest a test waits for one subprocess or condition, or for all its waits together:
#: pytest stops a test after 300 s (pyproject.toml), and a wait must end well before that, so
#: that the test fails with its own message rather than a timeout dump.
LONGEST_WAIT_S = 240


class WaitBudget:
    """One time budget shared by several waits of a test.

    Examples:
        >>> budget = WaitBudget(200)
        >>> wait_for(started, budget.left_s())                      # doctest: +SKIP
        >>> wait_for(finished, budget.left_s())                     # doctest: +SKIP
    """

    def __init__(self, seconds: float, *, limit_s: float = LONGEST_WAIT_S) -> None:
        """``limit_s``: the most the test may wait (a test with a ``timeout`` mark of its own
        passes that mark's seconds less what its cleanup takes)."""
        assert seconds <= limit_s, f"{seconds} s cannot fit in pytest's limit"
        self._deadline = time.monotonic() + seconds

    def left_s(self) -> float:
        """Seconds left (at least 0.1, so a wait still looks once)."""
        return max(0.1, self._deadline - time.monotonic())


def flush_until_tracked(
    consumer: KmqConsumer, tracker: RedeliveryTracker, *, in_flight: int = 0
) -> int:
    """Flush ``consumer``'s markers and wait until ``tracker`` has read every one of them, each
    markers partition to its end, with ``in_flight`` messages left open; returns the markers
    ``consumer`` wrote."""
    consumer.flush()
    written = consumer.stats.start_markers + consumer.stats.end_markers
    assert wait_for(
        lambda: (
            tracker.caught_up_partitions() == list(range(consumer.opened.partitions))
            and tracker.stats.markers == written
            and tracker.inflight_count() == in_flight
        )
    ), f"tracker read {tracker.stats.markers} of {written} markers, {tracker.inflight_count()} open"
    return written


def poll_until(consumer: KmqConsumer, count: int, timeout_s: float = 30) -> list[KmqMessage]:
    """Poll ``consumer`` until ``count`` messages arrived or ``timeout_s`` passed."""
    received: list[KmqMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count and time.monotonic() < deadline:
        received += consumer.poll(timeout_s=0.5)
    return received


@contextmanager
def running_worker(
    opened: OpenedQueue,
    handler: Callable[[KmqMessage], object],
    *,
    breaker: SharedBreaker | None = None,
) -> Iterator[Worker]:
    """Run a :class:`Worker` of ``opened`` with ``handler`` (and ``breaker``) on a thread for
    the block."""
    worker = Worker(opened, handler, breaker=breaker)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        yield worker
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop"


def produce_dead_letters(
    settings: KmqSettings,
    queue: Queue | OpenedQueue,
    items: list[tuple[str, str]],
    *,
    replayed: int = 0,
) -> None:
    """Put (key, error type) dead letters in ``queue``'s DLQ as the retry router writes them."""
    queue = queue.queue if isinstance(queue, OpenedQueue) else queue
    producer = Producer(settings.producer_config())
    # the DLQ's real count: a declared queue does not know its default auxiliary count
    partitions = partition_counts(settings).get(queue.dlq_topic, queue.dlq_partitions)
    for index, (key, error_type) in enumerate(items):
        partition = index % partitions
        origin = Origin(queue.topic, partition, 1_000 + index, 1_700_000_000_000)
        updates = copy_headers(
            origin, queue.group, Failure(error_type, "boom"), attempt=2,
            dlq_reason="failed 2 attempts",
        )  # fmt: skip
        extra = {REPLAY_COUNT: str(replayed)} if replayed else {}
        producer.produce(
            queue.dlq_topic,
            key=key,
            value=f"value-{key}",
            partition=partition,
            headers=[*replace_headers([("trace", b"t-" + key.encode())], {**updates, **extra})],
        )
    assert producer.flush(30) == 0
