"""``kmq bench spark``: the Spark path against the plain Python worker on the same messages.

One topic is filled once; the worker (consumer, retry router, no-op handler, one process) reads
it in one group and Spark local[2] (no-op function, Parquet output) in another, so both read the
same messages from the same broker in one run. Group joins and Spark's start are not timed.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.bench.common import Report, fill_topic
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.worker import Worker, WorkerStats
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.spark.session import local_session
from kmq_dagster.spark.tasks import SparkMessage

PARTITIONS = 2
RETRY_DELAYS_MS = (10_000,)


@dataclass
class SparkFigures:
    messages: int
    spark_msgs_per_s: float
    worker_msgs_per_s: float

    def as_json(self) -> str:
        return json.dumps(
            {
                "spark_msgs_per_s": round(self.spark_msgs_per_s),
                "worker_msgs_per_s": round(self.worker_msgs_per_s),
                "ratio": round(self.spark_msgs_per_s / self.worker_msgs_per_s, 3),
                "messages": self.messages,
            }
        )


def no_op(_message: KmqMessage | SparkMessage) -> None:
    """What both paths call per message: the benchmark measures the queue, not the work."""


def run_spark_benchmark(settings: KmqSettings, messages: int, report: Report) -> SparkFigures:
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    queues = {
        group: Queue(topic, group, partitions=PARTITIONS,
                     retry_policy=RetryPolicy.fixed(RETRY_DELAYS_MS))
        for group in ("worker", "spark")
    }  # fmt: skip
    for queue in queues.values():
        provision_queue(settings, queue, delay_queue=False)
    fill_topic(settings, topic, messages, PARTITIONS)
    report(f"{messages:,} messages of 100 bytes on {PARTITIONS} partitions")
    worker = worker_throughput(settings, queues["worker"], messages)
    report(f"plain Python worker: {worker:,.0f} msg/s")
    spark = spark_throughput(settings, queues["spark"], messages)
    report(f"Spark local[2]: {spark:,.0f} msg/s")
    return SparkFigures(messages, spark, worker)


def worker_throughput(settings: KmqSettings, queue: Queue, messages: int) -> float:
    worker = Worker(settings, queue, no_op)
    stop = threading.Event()
    started = [0.0]

    def on_batch(stats: WorkerStats) -> None:
        if stats.handled and not started[0]:
            started[0] = time.perf_counter()  # the group join is not timed
        if stats.handled >= messages:
            stop.set()

    worker.run(stop, on_batch)
    return messages / (time.perf_counter() - started[0])


def spark_throughput(settings: KmqSettings, queue: Queue, messages: int) -> float:
    session = local_session("kmq bench spark")
    with tempfile.TemporaryDirectory(prefix="kmq-bench-spark-") as scratch:
        job = SparkQueueJob(
            session, settings, queue, function=no_op,
            output_path=str(Path(scratch) / "out.parquet"),
        )  # fmt: skip
        try:
            if not job.lease.wait_for_partitions(120):
                raise KmqTimeoutError("the Spark job got no partitions")
            started = time.perf_counter()
            read = 0
            while read < messages:
                read += job.run_batch().read
            return messages / (time.perf_counter() - started)
        finally:
            job.close()
            session.stop()
