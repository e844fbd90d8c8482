"""``kmq demo``: the whole pipeline on one machine, from an empty embedded broker to a summary.

Starts the embedded broker on a free port, provisions ``orders``, produces a sample stream,
then runs a redelivery tracker and Spark batches (which also consume the retry topics) until
every order is either in the output or in the dead-letter topic.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.core.naming import dlq_topic, retry_topic
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.demo_orders import order_value, price_order
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.kafka.tracker import Tracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.spark.session import local_session

TOPIC = "orders"
GROUP = "pricing"
PARTITIONS = 2
RETRY_DELAYS_MS = (1_000, 3_000)

Report = Callable[[str], None]


@dataclass
class DemoSummary:
    produced: int
    processed: int
    retried: int
    redelivered: int
    dead_lettered: int
    lost: int
    duplicates: int
    output: str

    def table(self) -> str:
        rows = [
            ("produced", self.produced),
            ("processed", self.processed),
            ("retried", self.retried),
            ("redelivered", self.redelivered),
            ("dead-lettered", self.dead_lettered),
            ("lost", self.lost),
            ("duplicates", self.duplicates),
        ]
        lines = [f"  {name:<14} {count:>8,}" for name, count in rows]
        return "\n".join(["kmq demo summary", *lines, f"  output         {self.output}"])

    def as_json(self) -> str:
        return json.dumps(vars(self))


def run_demo(orders: int, output_dir: Path, report: Report, timeout_s: float = 600) -> DemoSummary:
    output = str(output_dir / "orders_priced.parquet")
    with EmbeddedBroker(port=0) as broker:
        settings = KmqSettings(bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=6_000)
        report(f"embedded broker on {broker.bootstrap_servers}")
        provision_queue(
            settings, TOPIC, partitions=PARTITIONS, group=GROUP, retry_delays_ms=RETRY_DELAYS_MS
        )
        _produce(settings, orders)
        report(f"produced {orders:,} orders to {TOPIC} (~5% poison, ~5% failing once)")
        tracker = Tracker(settings, TOPIC, GROUP)
        stop = threading.Event()
        tracker_thread = threading.Thread(target=tracker.run, args=(stop,), daemon=True)
        tracker_thread.start()
        report("starting Spark (local[2]) ...")
        spark = local_session("kmq demo")
        job = SparkQueueJob(
            spark, settings, TOPIC, GROUP, function=price_order, output_path=output,
            policy=RetryPolicy.fixed(RETRY_DELAYS_MS, non_retryable=["JSONDecodeError"]),
        )  # fmt: skip
        try:
            processed, rows = _drain(
                job, spark, settings, orders=orders, output=output, report=report,
                timeout_s=timeout_s,
            )  # fmt: skip
            retried = sum(
                count_records(settings, retry_topic(TOPIC, GROUP, ms), PARTITIONS)
                for ms in RETRY_DELAYS_MS
            )
            dead = count_records(settings, dlq_topic(TOPIC, GROUP), PARTITIONS)
        finally:
            job.close()
            spark.stop()
            stop.set()
            tracker_thread.join(30)
    return DemoSummary(
        produced=orders,
        processed=processed,
        retried=retried,
        redelivered=tracker.stats.redelivered,
        dead_lettered=dead,
        lost=orders - processed - dead,
        duplicates=rows - processed,
        output=output,
    )


def _produce(settings: KmqSettings, orders: int) -> None:
    producer = Producer(settings.producer_config(**{"linger.ms": 20}))
    for order_id in range(orders):
        producer.produce(TOPIC, key=str(order_id).encode(), value=order_value(order_id))
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the broker did not take every order")


def _drain(
    job: SparkQueueJob,
    spark: SparkSession,
    settings: KmqSettings,
    *,
    orders: int,
    output: str,
    report: Report,
    timeout_s: float,
) -> tuple[int, int]:
    """Run batches until every order is processed or dead-lettered; (distinct, rows)."""
    deadline = time.monotonic() + timeout_s
    processed = rows = 0
    while time.monotonic() < deadline:
        batch = job.run_batch()
        if batch.read:
            frame = spark.read.parquet(output)
            rows = frame.count()
            processed = frame.select("topic", "partition", "offset").distinct().count()
        dead = count_records(settings, dlq_topic(TOPIC, GROUP), PARTITIONS)
        report(
            f"batch {batch.batch_id}: read {batch.read:,}, ok {batch.succeeded:,}, failed "
            f"{batch.failed:,} | processed {processed:,} + dead-lettered {dead:,} of {orders:,}"
        )
        if processed + dead >= orders:
            return processed, rows
        if batch.read == 0:
            time.sleep(0.5)  # retries not due yet
    raise TimeoutError(f"not drained within {timeout_s:.0f} s")
