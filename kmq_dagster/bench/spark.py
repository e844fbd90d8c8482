"""``kmq bench spark``: the Spark path against the plain Python worker and against plain Spark.

Each round fills one topic, then reads it three ways: the worker (consumer, retry router,
no-op handler, one process) in one group, ``SparkQueueJob`` on local[2] (no-op function,
Parquet output) in another, and a plain PySpark job over a Parquet dump of the same messages
(same function, same output columns, same sink, no kmq; also reading Kafka without kmq, and
as a DataFrame job). Group joins, Spark's start (its Python workers included), a warm-up
round of each Spark path and the dump are not timed. Throughputs are medians over the rounds;
``breakdown_ms`` says where the Spark path's batches spent their time, per million messages,
and ``cpu_s_per_million`` how much CPU each path took from every process of the run (the
embedded broker, Spark's JVM, Python): on a machine of few cores that, not waiting, bounds a
path's throughput.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from kmq_dagster.bench import cpu
from kmq_dagster.bench.common import Report, fill_topic
from kmq_dagster.bench.plain_spark import (
    dataframe_spark_seconds,
    dump_topic,
    kafka_spark_seconds,
    plain_spark_seconds,
)
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import KmqError, KmqTimeoutError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.spark.session import local_session
from kmq_dagster.spark.tasks import SparkMessage
from kmq_dagster.worker.worker import Worker, WorkerStats

PARTITIONS = 2
RETRY_DELAYS_MS = (10_000,)
#: Messages of the untimed round that warms both Spark paths up.
WARM_UP_MESSAGES = 200_000


@dataclass
class SparkFigures:
    messages: int
    worker_runs: list[float] = field(default_factory=list)
    spark_runs: list[float] = field(default_factory=list)
    plain_runs: list[float] = field(default_factory=list)
    dataframe_runs: list[float] = field(default_factory=list)
    kafka_runs: list[float] = field(default_factory=list)
    #: Milliseconds per phase, summed over every timed batch of every round.
    breakdown_ms: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    #: CPU seconds per path and kind of process (broker, jvm, python), over the timed runs.
    cpu_s: dict[str, dict[str, float]] = field(default_factory=dict)

    def cpu_per_million(self) -> dict[str, dict[str, float]]:
        """CPU seconds per million messages, per path and kind of process, with a total."""
        per_million = 1_000_000 / (self.messages * max(1, len(self.spark_runs)))
        return {
            path: {
                **{kind: round(s * per_million, 2) for kind, s in sorted(used.items())},
                "total": round(sum(used.values()) * per_million, 2),
            }
            for path, used in self.cpu_s.items()
        }

    @contextmanager
    def cpu_of(self, path: str) -> Iterator[None]:
        """Count the CPU the whole process tree uses meanwhile towards ``path``."""
        if not cpu.available():
            yield
            return
        before = cpu.tree_cpu_s()
        yield
        totals = self.cpu_s.setdefault(path, {})
        for kind, seconds in cpu.used_since(before).items():
            totals[kind] = totals.get(kind, 0.0) + seconds

    def as_json(self) -> str:
        worker, spark, plain, dataframe, kafka = (
            statistics.median(runs)
            for runs in (
                self.worker_runs,
                self.spark_runs,
                self.plain_runs,
                self.dataframe_runs,
                self.kafka_runs,
            )
        )
        per_million = 1_000_000 / (self.messages * len(self.spark_runs))
        return json.dumps(
            {
                "spark_msgs_per_s": round(spark),
                "worker_msgs_per_s": round(worker),
                "ratio": round(spark / worker, 3),
                "plain_spark_msgs_per_s": round(plain),
                "ratio_vs_plain_spark": round(spark / plain, 3),
                "plain_spark_dataframe_msgs_per_s": round(dataframe),
                "ratio_vs_plain_dataframe": round(spark / dataframe, 3),
                "plain_spark_from_kafka_msgs_per_s": round(kafka),
                "ratio_vs_plain_spark_from_kafka": round(spark / kafka, 3),
                "breakdown_ms": {k: round(v * per_million) for k, v in self.breakdown_ms.items()},
                "cpu_s_per_million": self.cpu_per_million(),
                "cores": os.cpu_count(),
                "messages": self.messages,
                "rounds": len(self.spark_runs),
                "batches": self.batches,
            }
        )


def no_op(_message: KmqMessage | SparkMessage) -> None:
    """What every path calls per message: the benchmark measures the queue, not the work."""


def run_spark_benchmark(
    settings: KmqSettings, messages: int, report: Report, rounds: int = 3
) -> SparkFigures:
    figures = SparkFigures(messages)
    report(f"{rounds} rounds of {messages:,} messages of 100 bytes on {PARTITIONS} partitions")
    session = local_session("kmq bench spark")
    try:
        # Both Spark paths get faster over their first runs (the JVM compiles its hot code):
        # one untimed round of each first.
        warm_up = min(messages, WARM_UP_MESSAGES)
        report(f"warming up both Spark paths with {warm_up:,} messages (not timed) ...")
        topic = _filled_topic(settings, warm_up)
        spark_throughput(session, settings, topic, warm_up, SparkFigures(warm_up))
        plain_spark_throughput(session, settings, topic, warm_up, SparkFigures(warm_up))
        for number in range(1, rounds + 1):
            topic = _filled_topic(settings, messages)
            figures.worker_runs.append(worker_throughput(settings, topic, messages))
            figures.spark_runs.append(spark_throughput(session, settings, topic, messages, figures))
            plain, dataframe, kafka = plain_spark_throughput(
                session, settings, topic, messages, figures
            )
            figures.plain_runs.append(plain)
            figures.dataframe_runs.append(dataframe)
            figures.kafka_runs.append(kafka)
            report(
                f"round {number}/{rounds}: worker {figures.worker_runs[-1]:,.0f} msg/s, "
                f"Spark with kmq {figures.spark_runs[-1]:,.0f} msg/s, plain Spark "
                f"{plain:,.0f} msg/s (reading Kafka {kafka:,.0f}, as a DataFrame job "
                f"{dataframe:,.0f})"
            )
    finally:
        session.stop()
    per_million = 1_000_000 / (messages * rounds)
    report(
        "where the Spark path's time went, ms per million messages (task phases summed over "
        "the parallel tasks): "
        + ", ".join(f"{k} {v * per_million:,.0f}" for k, v in figures.breakdown_ms.items())
    )
    if figures.cpu_s:
        report(
            f"CPU seconds per million messages, every process of the run ({os.cpu_count()} "
            "cores): "
            + "; ".join(
                f"{path} {used['total']:.2f} ("
                + ", ".join(f"{kind} {s:.2f}" for kind, s in used.items() if kind != "total")
                + ")"
                for path, used in figures.cpu_per_million().items()
            )
        )
    return figures


def _filled_topic(settings: KmqSettings, messages: int) -> str:
    """A new topic of ``messages`` messages, provisioned for the groups "worker" and "spark"."""
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    for group in ("worker", "spark"):
        provision_queue(settings, _queue(topic, group), delay_queue=False)
    fill_topic(settings, topic, messages, PARTITIONS)
    return topic


def _queue(topic: str, group: str) -> Queue:
    return Queue(
        topic, group, partitions=PARTITIONS, retry_policy=RetryPolicy.fixed(RETRY_DELAYS_MS)
    )


def worker_throughput(settings: KmqSettings, topic: str, messages: int) -> float:
    worker = Worker(open_queue(settings, topic, "worker"), no_op)
    stop = threading.Event()
    started = [0.0]

    def on_batch(stats: WorkerStats) -> None:
        if stats.handled and not started[0]:
            started[0] = time.perf_counter()  # the group join is not timed
        if stats.handled >= messages:
            stop.set()

    worker.run(stop, on_batch)
    return messages / (time.perf_counter() - started[0])


def spark_throughput(
    session: SparkSession, settings: KmqSettings, topic: str, messages: int, figures: SparkFigures
) -> float:
    with tempfile.TemporaryDirectory(prefix="kmq-bench-spark-") as scratch:
        job = SparkQueueJob(
            session, open_queue(settings, topic, "spark"), function=no_op,
            output_path=str(Path(scratch) / "out.parquet"),
        )  # fmt: skip
        try:
            if not job.lease.wait_for_partitions(120):
                raise KmqTimeoutError("the Spark job got no partitions")
            job.warm_up()
            with figures.cpu_of("spark"):
                started = time.perf_counter()
                read = 0
                while read < messages:
                    batch = job.run_batch()
                    read += batch.read
                    figures.breakdown_ms.update(batch.timings_ms)
                    figures.batches += 1
                seconds = time.perf_counter() - started
            return messages / seconds
        finally:
            job.close()


def plain_spark_throughput(
    session: SparkSession, settings: KmqSettings, topic: str, messages: int, figures: SparkFigures
) -> tuple[float, float, float]:
    """Plain Spark through kmq's sink, as a DataFrame job, and reading Kafka, in msg/s."""
    with tempfile.TemporaryDirectory(prefix="kmq-bench-plain-") as scratch:
        dump = Path(scratch) / "dump"
        dumped = dump_topic(settings, topic, PARTITIONS, dump)
        if dumped != messages:
            raise KmqError(f"dumped {dumped} of {messages} messages")
        with figures.cpu_of("plain_spark"):
            plain = plain_spark_seconds(session, no_op, dump, Path(scratch) / "out")
        with figures.cpu_of("plain_spark_dataframe"):
            dataframe = dataframe_spark_seconds(session, no_op, dump, Path(scratch) / "frame")
        with figures.cpu_of("plain_spark_from_kafka"):
            kafka = kafka_spark_seconds(
                session, no_op, settings, topic, partitions=PARTITIONS,
                output=Path(scratch) / "kafka",
            )  # fmt: skip
        return messages / plain, messages / dataframe, messages / kafka
