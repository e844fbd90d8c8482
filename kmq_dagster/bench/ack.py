"""``kmq bench ack``: per-message acknowledgement against a plain at-least-once consumer.

All phases run in one process against one broker, so their ratio is comparable on a noisy
machine. The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass

from confluent_kafka import Message

from kmq_dagster.bench.ack_latency import latency_rounds
from kmq_dagster.bench.ack_worker import (
    DEFAULT_WORKER_MESSAGES,
    WorkerFigures,
    plain_drain,
    worker_plan,
)
from kmq_dagster.bench.common import Cluster, Report, fill_topic, percentile, rotated
from kmq_dagster.core.inflight import PartitionInflight
from kmq_dagster.core.markers import StartMarker
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry_headers import origin_of
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings

GROUP = "bench"
#: Shorter throughput runs time mostly what librdkafka fetched while the consumer joined.
STEADY_RUN_S = 0.5
#: Latency rounds (at most; fewer with ``--rounds`` below it): 20 s each, plus group joins.
LATENCY_ROUNDS = 3


@dataclass
class AckFigures:
    plain_msgs_per_s: float
    #: Handed out as confluent-kafka records (``poll_records``).
    ack_msgs_per_s: float
    #: Handed out as :class:`KmqMessage` views (``poll``).
    ack_view_msgs_per_s: float
    p50_latency_ms: float
    p95_latency_ms: float
    p99_latency_ms: float
    #: A plain consumer's produce-to-commit latency at the same load, in the same run.
    plain_p50_latency_ms: float
    plain_p95_latency_ms: float
    #: The median over rounds of kmq's p95 / the plain consumer's p95 in the same round.
    p95_latency_ratio_vs_plain: float
    #: A plain consumer that also reads the queue's retry and redelivery topics, as kmq does.
    plain_same_topics_p95_latency_ms: float
    #: The median over rounds of kmq's p95 / that consumer's p95 in the same round.
    p95_latency_ratio_vs_plain_same_topics: float
    redelivery_lateness_p50_ms: float
    redelivery_lateness_p99_ms: float
    tracker_bytes_per_inflight: float
    #: The public Worker and the plain no-op consumer, in the same rounds.
    worker: WorkerFigures

    def as_json(self) -> str:
        figures = {
            "plain_msgs_per_s": round(self.plain_msgs_per_s),
            "ack_msgs_per_s": round(self.ack_msgs_per_s),
            "ratio": round(self.ack_msgs_per_s / self.plain_msgs_per_s, 3),
            "ack_view_msgs_per_s": round(self.ack_view_msgs_per_s),
            "view_ratio": round(self.ack_view_msgs_per_s / self.plain_msgs_per_s, 3),
            "p95_latency_ms": round(self.p95_latency_ms, 1),
            "plain_p95_latency_ms": round(self.plain_p95_latency_ms, 1),
            "p95_latency_ratio_vs_plain": round(self.p95_latency_ratio_vs_plain, 2),
            "plain_same_topics_p95_latency_ms": round(self.plain_same_topics_p95_latency_ms, 1),
            "p95_latency_ratio_vs_plain_same_topics": round(
                self.p95_latency_ratio_vs_plain_same_topics, 2
            ),
            "p50_latency_ms": round(self.p50_latency_ms, 1),
            "plain_p50_latency_ms": round(self.plain_p50_latency_ms, 1),
            "redelivery_lateness_p99_ms": round(self.redelivery_lateness_p99_ms, 1),
            "tracker_bytes_per_inflight": round(self.tracker_bytes_per_inflight, 2),
        }
        return json.dumps(figures | self.worker.as_dict())


def no_op_handler(_message: object) -> None:
    """The handler both consumers call per message: the benchmark measures the queue."""


def _new_queue(
    settings: KmqSettings,
    partitions: int,
    *,
    visibility_timeout_ms: int = 30_000,
    max_redeliveries: int = 3,
) -> OpenedQueue:
    queue = Queue(
        f"bench-{uuid.uuid4().hex[:8]}",
        GROUP,
        partitions=partitions,
        visibility_timeout_ms=visibility_timeout_ms,
        max_redeliveries=max_redeliveries,
    )
    return provision_queue(settings, queue, delay_queue=False).opened


@contextmanager
def _tracker_running(queue: OpenedQueue) -> Iterator[None]:
    """A redelivery tracker of ``queue`` on a thread for the length of the block, as a real
    deployment runs one beside its consumers; stopped (and joined) however the block ends."""
    stop = threading.Event()
    tracker = RedeliveryTracker(queue)
    tracker_thread = threading.Thread(target=tracker.run, args=(stop,), daemon=True)
    tracker_thread.start()
    try:
        yield
    finally:
        stop.set()
        tracker_thread.join(30)


def plain_throughput(
    settings: KmqSettings, messages: int, partitions: int, commit_async: bool = False
) -> float:
    """A plain at-least-once consumer: same batch size and handler, a commit after every batch.

    With ``commit_async`` the commit does not wait for the broker (still at-least-once); the
    run's last commit does.
    """
    topic = _new_queue(settings, partitions).topic
    fill_topic(settings, topic, messages, partitions)
    return plain_drain(
        settings, topic, messages, no_op_handler, commit_async=commit_async
    ).msgs_per_s


def ack_throughput(
    settings: KmqSettings, messages: int, partitions: int, views: bool = False
) -> float:
    """Per-message ack: start markers before commit, one ack per message, tracker running.

    Messages are handed out as confluent-kafka records, or with ``views`` as KmqMessage.
    """
    queue = _new_queue(settings, partitions)
    fill_topic(settings, queue.topic, messages, partitions)
    with _tracker_running(queue), closing(KmqConsumer(queue)) as consumer:
        poll: Callable[[float], Sequence[KmqMessage | Message]] = (
            consumer.poll if views else consumer.poll_records
        )
        acked = 0
        started = 0.0
        while acked < messages:
            batch = poll(1.0)
            if batch and not started:
                started = time.perf_counter()
            for message in batch:
                no_op_handler(message)
                consumer.ack(message)
            acked += len(batch)
        consumer.flush()
        return messages / (time.perf_counter() - started)


def redelivery_lateness_ms(
    settings: KmqSettings, messages: int, visibility_timeout_ms: int, partitions: int
) -> list[float]:
    """How long after its deadline each never-acknowledged message comes back."""
    queue = _new_queue(
        settings, partitions, visibility_timeout_ms=visibility_timeout_ms, max_redeliveries=10
    )
    fill_topic(settings, queue.topic, messages, partitions)
    deadline_at: dict[tuple[int, int], float] = {}
    lateness: list[float] = []
    with _tracker_running(queue), closing(KmqConsumer(queue)) as consumer:
        while len(lateness) < messages:
            batch = consumer.poll(timeout_s=0.05)
            # The consumer sets deadlines from the time just before poll() returns.
            fetched = time.time() * 1000
            for message in batch:
                if message.redelivery_count == 0:
                    deadline_at[(message.partition, message.offset)] = (
                        fetched + visibility_timeout_ms
                    )
                    continue
                origin = origin_of(message.headers, message.topic, message.partition, 0, 0)
                lateness.append(fetched - deadline_at[(origin.partition, origin.offset)])
                consumer.ack(message)
    return lateness


def tracker_bytes_per_inflight(inflight: int, batch_size: int) -> float:
    """Memory of the tracker's in-flight state holding ``inflight`` unacknowledged messages.

    Fed the start markers consumers write for batches of ``batch_size`` (one per run).
    """
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    state = PartitionInflight()
    for marker_offset, first in enumerate(range(0, inflight, batch_size)):
        count = min(batch_size, inflight - first)
        state.record_start(marker_offset, StartMarker("orders", 0, first, count, 1_000_000))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert state.inflight_count() == inflight
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return used / inflight


def run_ack_benchmark(
    cluster: Cluster,
    messages: int,
    report: Report,
    *,
    partitions: int = 2,
    rounds: int = 3,
    worker_messages: int = DEFAULT_WORKER_MESSAGES,
    latency_seconds: float = 10,
    tracing: bool = False,
) -> AckFigures:
    """Every figure of ``kmq bench ack``; throughputs are medians of ``rounds`` runs.

    Beside the consumers, each round runs the public ``Worker`` and the plain no-op consumer
    it is held against (:mod:`kmq_dagster.bench.ack_worker`) on ``worker_messages`` each;
    with ``tracing``, ``Worker`` at concurrency 1 with OpenTelemetry tracing on too. Each
    latency run offers its load for ``latency_seconds``.

    Each measurement gets its own ``cluster()`` (a fresh embedded broker, unless external),
    and the order of the consumers rotates from round to round: the embedded broker's
    fetch rate depends on what it already holds, and no consumer may profit from going first.
    """
    phases: dict[str, Callable[[KmqSettings], float]] = {
        "plain (sync commit)": lambda s: plain_throughput(s, messages, partitions),
        "plain (async commit)": lambda s: plain_throughput(
            s, messages, partitions, commit_async=True
        ),
        "per-message ack (records)": lambda s: ack_throughput(s, messages, partitions),
        "per-message ack (KmqMessage)": lambda s: ack_throughput(
            s, messages, partitions, views=True
        ),
    }
    runs: dict[str, list[float]] = {name: [] for name in phases}
    drains = worker_plan(worker_messages, partitions, tracing=tracing)
    worker = WorkerFigures(worker_messages, traced=tracing)
    for round_number in range(1, rounds + 1):
        # Each group rotates on its own, so the pairs compared alternate which goes first.
        for name in rotated(list(phases), round_number) + rotated(list(drains), round_number):
            with cluster() as settings:
                if name in phases:
                    runs[name].append(phases[name](settings))
                else:
                    worker.runs[name].append(drains[name](settings))
        report(
            f"round {round_number}/{rounds}: "
            + ", ".join(f"{name} {runs[name][-1]:,.0f} msg/s" for name in phases)
            + "; "
            + ", ".join(
                f"{name} {d[-1].msgs_per_s:,.0f} msg/s (handled {d[-1].handled:,})"
                for name, d in worker.runs.items()
            )
        )
    sync_runs, async_runs, ack_runs, view_runs = runs.values()
    # The ratio is taken against the faster plain consumer, whichever it was.
    plain_runs = max(sync_runs, async_runs, key=statistics.median)
    plain, ack, view = (statistics.median(r) for r in (plain_runs, ack_runs, view_runs))
    report(
        f"medians: plain {plain:,.0f} msg/s; per-message ack {ack:,.0f} msg/s "
        f"(ratio {ack / plain:.2f}) with records, {view:,.0f} msg/s ({view / plain:.2f}) "
        "with KmqMessage views"
    )
    run_seconds = messages / plain
    if run_seconds < STEADY_RUN_S:
        report(
            f"note: a plain run lasted {run_seconds:.2f} s, mostly spent on messages fetched "
            "ahead during the group join; the ratio is not the steady one "
            "(--messages 1000000 runs about a second)"
        )
    report(
        f"what users run, {worker_messages:,} messages on {partitions} partitions per run, "
        "timed from the first handler call to the last acknowledgement:"
    )
    for line in worker.table():
        report(line)
    latency_round_count = min(rounds, LATENCY_ROUNDS)
    report(
        f"latency at an offered load of 10,000 msg/s for {latency_seconds:g} s, a plain "
        f"consumer, one reading kmq's topics, and kmq, {latency_round_count} rounds ..."
    )
    latency = latency_rounds(
        cluster, _new_queue, latency_round_count, partitions, report, seconds=latency_seconds
    )
    report(
        f"medians: produce-to-ack p50 {latency.p50_ms:.1f} ms, p95 {latency.p95_ms:.1f} ms; "
        f"plain produce-to-commit p50 {latency.plain_p50_ms:.1f} ms, "
        f"p95 {latency.plain_p95_ms:.1f} ms; p95 ratio kmq / plain {latency.p95_ratio:.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in latency.p95_ratios)}); plain reading kmq's "
        f"topics p95 {latency.plain_same_topics_p95_ms:.1f} ms, p95 ratio kmq / that "
        f"{latency.p95_ratio_same_topics:.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in latency.p95_ratios_same_topics)})"
    )
    report("redelivery lateness over 2,000 unacknowledged messages (2 s timeout) ...")
    with cluster() as settings:
        lateness = redelivery_lateness_ms(settings, 2_000, 2_000, partitions)
    report(
        f"redelivered {len(lateness)} after their deadline by p50 "
        f"{percentile(lateness, 0.5):.0f} ms, p99 {percentile(lateness, 0.99):.0f} ms, "
        f"max {max(lateness):.0f} ms; earliest {min(lateness):.0f} ms"
    )
    per_inflight = tracker_bytes_per_inflight(1_000_000, batch_size=500)
    report(f"tracker memory: {per_inflight:.2f} bytes per in-flight message (1,000,000 in flight)")
    return AckFigures(
        plain_msgs_per_s=plain,
        ack_msgs_per_s=ack,
        ack_view_msgs_per_s=view,
        p50_latency_ms=latency.p50_ms,
        p95_latency_ms=latency.p95_ms,
        p99_latency_ms=latency.p99_ms,
        plain_p50_latency_ms=latency.plain_p50_ms,
        plain_p95_latency_ms=latency.plain_p95_ms,
        p95_latency_ratio_vs_plain=latency.p95_ratio,
        plain_same_topics_p95_latency_ms=latency.plain_same_topics_p95_ms,
        p95_latency_ratio_vs_plain_same_topics=latency.p95_ratio_same_topics,
        redelivery_lateness_p50_ms=percentile(lateness, 0.5),
        redelivery_lateness_p99_ms=percentile(lateness, 0.99),
        tracker_bytes_per_inflight=per_inflight,
        worker=worker,
    )
