"""Produce-to-done latency at an offered load, for ``kmq bench ack``: kmq's per-message ack
against a plain consumer's commit, in the same run.

The absolute figure says more about the machine than about kmq (its p95 moved from 227 to
1,056 ms between runs on one quiet machine, with the same code), so the bench also reports it as a
ratio to a plain at-least-once consumer measured the same way at the same load. Both are timed
from the produce call to the moment the consumer declares the message done without waiting for
the broker: kmq's ``ack()`` (its end markers are written in the background) and the plain
consumer's asynchronous commit after the batch that held it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, Producer

from kmq_dagster.bench.common import Cluster, Report, percentile, rotated
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_topic
from kmq_dagster.settings import KmqSettings

#: How long a fetch waits for a first message, for both consumers.
FETCH_WAIT_S = 0.05
#: How long the offered load's producer lets a batch fill (librdkafka's default).
LINGER_MS = 5


class OfferedLoad:
    """``rate_per_s`` messages a second for ``seconds`` to ``topic`` (value: the index), on a
    thread; :attr:`sent_at` holds each one's ``perf_counter()`` at its produce call."""

    def __init__(
        self, settings: KmqSettings, topic: str, rate_per_s: int, seconds: float, partitions: int
    ) -> None:
        self.total = int(rate_per_s * seconds)
        self.sent_at: dict[int, float] = {}
        self._topic, self._rate_per_s, self._partitions = topic, rate_per_s, partitions
        # librdkafka's default linger (5 ms), as producers in the field run. At 1 ms the load
        # came in ~5x more record batches, and the embedded broker's fetch time grows with a
        # partition's batch count: at 10,000 msg/s its fetches went from 4 to 57 ms in 8 s, so
        # every consumer fell further behind for the whole run and the latencies measured that
        # (p95 in seconds, plain consumer too). At 5 ms they stayed flat (p50 42 ms, p95 66 ms
        # for a plain consumer; docs/benchmarks.md, stop 63).
        self._producer = Producer(settings.producer_config(**{"linger.ms": LINGER_MS}))
        # An idempotent producer first fetches a producer id (about 0.5 s on the embedded
        # broker): a start-up cost, not per-message latency, so it is paid before the clock.
        warm_up_topic = f"{topic}-warm-up"
        provision_topic(settings, warm_up_topic, partitions=1, delay_queue=False)
        self._producer.produce(warm_up_topic, value=b"warm-up")
        self._producer.flush(30)
        self._thread = threading.Thread(target=self._offer, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def latency_ms(self, value: bytes | None) -> float:
        return (time.perf_counter() - self.sent_at[int(value or b"0")]) * 1000

    def _offer(self) -> None:
        begin = time.perf_counter()
        for i in range(self.total):
            pause = begin + i / self._rate_per_s - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            self.sent_at[i] = time.perf_counter()
            self._producer.produce(
                self._topic, value=str(i).encode(), partition=i % self._partitions
            )
            self._producer.poll(0)
        self._producer.flush(60)


def ack_latency_ms(
    settings: KmqSettings, queue: OpenedQueue, rate_per_s: int, seconds: float, partitions: int
) -> list[float]:
    """Produce-to-ack latency at an offered load: produce call to ``ack()`` of that message."""
    consumer = KmqConsumer(queue)
    # Join the group before the clock starts: a join is not part of per-message latency.
    while not consumer.assignment_ready():
        consumer.poll(timeout_s=0.2)
    load = OfferedLoad(settings, queue.topic, rate_per_s, seconds, partitions)
    load.start()
    latencies: list[float] = []
    try:
        while len(latencies) < load.total:
            for message in consumer.poll(timeout_s=FETCH_WAIT_S):
                consumer.ack(message)
                latencies.append(load.latency_ms(message.value))
        load.join()
    finally:
        consumer.close()
    return latencies


def plain_commit_latency_ms(
    settings: KmqSettings,
    topic: str,
    rate_per_s: int,
    seconds: float,
    partitions: int,
    *,
    also_reads: list[str] | None = None,
) -> list[float]:
    """A plain at-least-once consumer at the same load: produce call to the asynchronous
    commit after the batch holding the message, fetched the way :class:`KmqConsumer` fetches.

    With ``also_reads`` it subscribes to those (empty) topics too, as a kmq consumer reads its
    queue's retry and redelivery topics beside the queue topic."""
    consumer = Consumer(settings.consumer_config(f"plain-{topic}"))
    consumer.subscribe([topic, *(also_reads or [])])
    while not consumer.assignment():
        consumer.consume(1, 0.2)  # the topic is empty until the load starts
    load = OfferedLoad(settings, topic, rate_per_s, seconds, partitions)
    load.start()
    latencies: list[float] = []
    try:
        while len(latencies) < load.total:
            batch = [
                m
                for m in _fetch(consumer, settings.batch_size)
                if m.error() is None and m.topic() == topic
            ]
            if not batch:
                continue
            consumer.commit(asynchronous=True)  # the records are handled: a no-op handler
            latencies.extend(load.latency_ms(record.value()) for record in batch)
        load.join()
    finally:
        consumer.close()
    return latencies


def _fetch(consumer: Consumer, batch_size: int) -> list[Message]:
    """What is here; else wait for one message, then take what arrived with it."""
    records = consumer.consume(batch_size, 0)
    if records:
        return records
    records = consumer.consume(1, FETCH_WAIT_S)
    if records and batch_size > 1:
        records += consumer.consume(batch_size - 1, 0)
    return records


@dataclass(frozen=True)
class LatencyFigures:
    """Percentiles in ms, medians over the rounds; ``p95_ratios`` per round (kmq / plain), and
    ``p95_ratios_same_topics`` per round (kmq / a plain consumer of the same topics as kmq)."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    plain_p50_ms: float
    plain_p95_ms: float
    p95_ratios: list[float]
    plain_same_topics_p95_ms: float
    p95_ratios_same_topics: list[float]

    @property
    def p95_ratio(self) -> float:
        """The median of the rounds' ratios: each pairs two runs made minutes apart."""
        return statistics.median(self.p95_ratios)

    @property
    def p95_ratio_same_topics(self) -> float:
        """The same against a plain consumer that also reads the queue's other topics."""
        return statistics.median(self.p95_ratios_same_topics)


#: The runs of a latency round: a plain consumer of the queue topic, one that also reads the
#: queue's other (empty) topics as kmq does, and kmq.
LATENCY_RUNS = ("plain", "plain_same_topics", "kmq")


def latency_rounds(
    cluster: Cluster,
    new_queue: Callable[[KmqSettings, int], OpenedQueue],
    rounds: int,
    partitions: int,
    report: Report,
    *,
    rate_per_s: int = 10_000,
    seconds: float = 10,
) -> LatencyFigures:
    """Each run's latency ``rounds`` times, in an order that rotates from round to round,
    each on its own ``cluster()``: on a shared machine one 10-second run can catch a stall of the
    other tenants (a plain p95 of 231 ms in one run and 938 ms in the next).

    The plain consumer of the same topics shows what reading them costs on the broker: a
    kmq consumer also reads its queue's retry and redelivery topics, and on the embedded
    broker a plain consumer of those five topics had a p95 of 190 ms against 115 ms for the
    queue topic alone (stop 53)."""
    runs: dict[str, list[list[float]]] = {name: [] for name in LATENCY_RUNS}
    for round_number in range(rounds):
        for name in rotated(list(LATENCY_RUNS), round_number + 1):
            with cluster() as settings:
                queue = new_queue(settings, partitions)
                if name == "kmq":
                    latencies = ack_latency_ms(settings, queue, rate_per_s, seconds, partitions)
                else:
                    others = [t for t in queue.queue.consumed_topics if t != queue.topic]
                    latencies = plain_commit_latency_ms(
                        settings, queue.topic, rate_per_s, seconds, partitions,
                        also_reads=others if name == "plain_same_topics" else None,
                    )  # fmt: skip
                runs[name].append(latencies)
        report(
            f"latency round {round_number + 1}/{rounds}, {len(runs['kmq'][-1]):,} messages a "
            f"run: p50 / p95 / p99, plain "
            f"produce-to-commit {_percentiles(runs['plain'][-1])}, the same reading kmq's "
            f"topics {_percentiles(runs['plain_same_topics'][-1])}, produce-to-ack "
            f"{_percentiles(runs['kmq'][-1])}"
        )

    def median_of(name: str, share: float) -> float:
        return statistics.median(percentile(run, share) for run in runs[name])

    def p95_ratios(other: str) -> list[float]:
        return [
            percentile(k, 0.95) / percentile(p, 0.95)
            for k, p in zip(runs["kmq"], runs[other], strict=True)
        ]

    return LatencyFigures(
        p50_ms=median_of("kmq", 0.5),
        p95_ms=median_of("kmq", 0.95),
        p99_ms=median_of("kmq", 0.99),
        plain_p50_ms=median_of("plain", 0.5),
        plain_p95_ms=median_of("plain", 0.95),
        p95_ratios=p95_ratios("plain"),
        plain_same_topics_p95_ms=median_of("plain_same_topics", 0.95),
        p95_ratios_same_topics=p95_ratios("plain_same_topics"),
    )


def _percentiles(values: list[float]) -> str:
    return " / ".join(f"{percentile(values, share):.1f}" for share in (0.5, 0.95, 0.99)) + " ms"
