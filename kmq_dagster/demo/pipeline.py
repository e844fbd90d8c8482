"""``kmq demo``: the whole pipeline on one machine, from an empty embedded broker to a summary.

Starts the embedded broker on a free port, provisions ``orders``, produces a sample stream,
then runs a redelivery tracker and Spark batches (which also consume the retry topics) until
every order is either in the output or in the dead-letter topic.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pyspark.sql import SparkSession

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.demo.orders import order_value, price_order
from kmq_dagster.demo.stopping import DemoStopped, stoppable_spark
from kmq_dagster.errors import DeliveryError, KmqTimeoutError
from kmq_dagster.home import kmq_home
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import produce
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import BatchReport, SparkQueueJob
from kmq_dagster.spark.processing import run_processing

log = logging.getLogger(__name__)

#: The demo queue: orders priced by the "pricing" group; poison orders are dead-lettered at
#: once (``JSONDecodeError`` is never retried), flaky ones retried after 1 s.
DEMO_QUEUE = Queue(
    "orders",
    "pricing",
    partitions=2,
    retry_policy=RetryPolicy.fixed((1_000, 3_000)),
    visibility_timeout_ms=30_000,
)


def demo_home() -> Path:
    """``~/.kmq/demo``: where the demo writes unless told otherwise; in kmq's private home,
    not in the folder it is run from (a clone, say), and printed in its summary."""
    return kmq_home() / "demo"


class Progress(Protocol):
    """Where the demo reports: a live line (:meth:`update`) and lines that stay (:meth:`note`)."""

    def update(self, text: str) -> None: ...

    def note(self, text: str) -> None: ...


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


def run_demo(
    orders: int,
    output_dir: Path,
    progress: Progress,
    *,
    stop: threading.Event | None = None,
    quiet: bool = True,
    jvm_log: Path | None = None,
    timeout_s: float = 600,
) -> DemoSummary | None:
    """Run the demo on a fresh embedded broker; ``quiet`` keeps Spark's console output off,
    ``jvm_log`` takes the JVM's console output.

    Returns:
        The summary, or ``None`` when ``stop`` was set first: then no phase starts after it,
        a running Spark batch is cut short, and every process the demo started (the broker,
        Spark's JVM and its Python workers) has ended when this returns.
    """
    stop = stop or threading.Event()
    output = str(output_dir / "orders_priced.parquet")
    queue = DEMO_QUEUE
    if stop.is_set():
        return None
    with EmbeddedBroker(port=0) as broker:
        if stop.is_set():
            return None
        settings = KmqSettings(bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=6_000)
        progress.note(f"embedded broker on {broker.bootstrap_servers}")
        opened = provision_queue(settings, queue).opened
        produce_orders(settings, orders, stop=stop)
        if stop.is_set():
            return None
        progress.note(f"produced {orders:,} orders to {queue.topic} (~5% poison, ~5% failing once)")
        tracker = RedeliveryTracker(opened)
        tracker_stop = threading.Event()
        tracker_thread = threading.Thread(target=tracker.run, args=(tracker_stop,), daemon=True)
        tracker_thread.start()
        try:
            progress.note("starting Spark (local[2]) ...")
            with stoppable_spark(stop, quiet=quiet, jvm_log=jvm_log) as spark:
                job = SparkQueueJob(spark, opened, function=price_order, output_path=output)
                try:
                    processed, rows = _drain(
                        job, spark, settings, orders=orders, output=output, progress=progress,
                        stop=stop, timeout_s=timeout_s,
                    )  # fmt: skip
                finally:
                    job.close()
            retried = sum(
                count_records(settings, name, opened.dlq_partitions)
                for name in queue.retry_topics.values()
            )
            dead = count_records(settings, queue.dlq_topic, opened.dlq_partitions)
        except Exception:
            if stop.is_set():  # Spark ended under a running call: the stop, not a failure
                log.debug("the demo stopped while Spark ran", exc_info=True)
                return None
            raise
        finally:
            tracker_stop.set()
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


def produce_orders(
    settings: KmqSettings, orders: int, first_id: int = 0, *, stop: threading.Event | None = None
) -> None:
    """Produce the demo's sample orders ``first_id`` .. ``first_id + orders - 1``; stops early
    (the rest unsent) once ``stop`` is set.

    Raises:
        DeliveryError: the broker did not take every order.
    """
    producer = new_producer(settings, **{"linger.ms": 20})
    for order_id in range(first_id, first_id + orders):
        if stop is not None and order_id % 1_000 == 0 and stop.is_set():
            break
        produce(producer, DEMO_QUEUE.topic, key=str(order_id).encode(), value=order_value(order_id))
    if producer.flush(60):
        raise DeliveryError("the broker did not take every order")


@dataclass
class _Tally:
    """What the demo's batches have done so far."""

    batches: int = 0
    processed: int = 0
    rows: int = 0


def _drain(
    job: SparkQueueJob,
    spark: SparkSession,
    settings: KmqSettings,
    *,
    orders: int,
    output: str,
    progress: Progress,
    stop: threading.Event,
    timeout_s: float,
) -> tuple[int, int]:
    """Run batches until every order is processed or dead-lettered, or ``stop`` is set;
    (distinct, rows).

    Raises:
        DemoStopped: ``stop`` was set first.
        KmqTimeoutError: not done within ``timeout_s``.
    """
    queue = job.queue
    done = threading.Event()
    tally = _Tally()

    def show(batch: BatchReport) -> None:
        if stop.is_set():  # no line about a batch once asked to stop
            done.set()
            return
        tally.batches += 1
        if batch.read:
            frame = spark.read.parquet(output)
            tally.rows = frame.count()
            tally.processed = frame.select("topic", "partition", "offset").distinct().count()
        dead = count_records(settings, queue.dlq_topic, queue.dlq_partitions)
        progress.update(
            f"batch {tally.batches}: read {batch.read:,}, ok {batch.succeeded:,}, failed "
            f"{batch.failed:,} | processed {tally.processed:,} + dead-lettered {dead:,} "
            f"of {orders:,}"
        )
        if tally.processed + dead >= orders:
            done.set()

    # Retries come due after the queue looks idle: the run goes on until every order is done.
    run_processing(
        job, None, stop=done, until_idle=False, max_seconds=timeout_s, on_batch=show,
        count_output=False,
    )  # fmt: skip
    if stop.is_set():
        raise DemoStopped
    if done.is_set():
        return tally.processed, tally.rows
    raise KmqTimeoutError(f"the demo did not finish within {timeout_s:.0f} s")
