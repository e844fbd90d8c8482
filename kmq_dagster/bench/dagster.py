"""``kmq bench dagster``: sensor tick time at 64 partitions, and sensor-launched processing
against ``kmq spark``'s direct path on the same messages.

1. Tick time: a 64-partition queue with a backlog, messages in flight and a few retries; the
   backlog sensor is evaluated as the daemon does (``build_sensor_context``), the median of
   several ticks is reported, and the observation sensor's too.
2. Throughput: one topic is filled once and read by two groups. Group ``dagster``: the backlog
   sensor ticks every ``tick_interval_s``; each run it requests is executed in process (one at a
   time, as the sensor allows) until the runs' materializations account for every message.
   Group ``direct``: a :class:`SparkQueueJob` runs batches until one reads nothing, as
   ``kmq spark`` does. Both clocks start once the messages are on the broker, and both include
   their group joins; Spark's start is not timed (the session is shared), and a small untimed
   batch in a third group warms its Python workers for both.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Definitions, build_sensor_context

from kmq_dagster.bench.common import Report, fill_topic
from kmq_dagster.bench.spark import no_op
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.resources import (
    AuditStoreResource,
    KmqResource,
    local_pyspark_resource,
    local_spark_config,
)
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.spark.processing import run_processing
from kmq_dagster.spark.session import start_session

PARTITIONS = 2
TICK_PARTITIONS = 64
RETRY_DELAYS_MS = (60_000,)


@dataclass
class DagsterFigures:
    sensor_tick_ms: float
    observation_tick_ms: float
    dagster_msgs_per_s: float
    direct_msgs_per_s: float
    messages: int
    runs: int

    def as_json(self) -> str:
        return json.dumps(
            {
                "sensor_tick_ms": round(self.sensor_tick_ms, 1),
                "dagster_msgs_per_s": round(self.dagster_msgs_per_s),
                "direct_msgs_per_s": round(self.direct_msgs_per_s),
                "ratio": round(self.dagster_msgs_per_s / self.direct_msgs_per_s, 3),
                "observation_tick_ms": round(self.observation_tick_ms, 1),
                "messages": self.messages,
                "runs": self.runs,
            }
        )


def run_dagster_benchmark(
    settings: KmqSettings,
    messages: int,
    report: Report,
    *,
    ticks: int = 11,
    tick_interval_s: float = 1.0,
) -> DagsterFigures:
    with tempfile.TemporaryDirectory(prefix="kmq-bench-dagster-") as scratch:
        kmq = KmqResource(
            bootstrap_servers=settings.bootstrap_servers,
            client_config=dict(settings.client_config),
            session_timeout_ms=settings.session_timeout_ms,
        )
        audit = AuditStoreResource(url=f"sqlite:///{Path(scratch) / 'audit.db'}")
        backlog_ms, observe_ms = tick_times(settings, kmq, audit, scratch, ticks)
        report(f"sensor tick at {TICK_PARTITIONS} partitions: backlog {backlog_ms:.0f} ms, "
               f"observation {observe_ms:.0f} ms (median of {ticks})")  # fmt: skip
        topic = f"bench-dagster-{uuid.uuid4().hex[:8]}"
        queues = {
            group: Queue(topic, group, partitions=PARTITIONS,
                         retry_policy=RetryPolicy.fixed(RETRY_DELAYS_MS))
            for group in ("dagster", "direct", "warm-up")
        }  # fmt: skip
        for queue in queues.values():
            provision_queue(settings, queue, delay_queue=False)
        spec = QueueSpec(
            queues["dagster"], function=no_op, output_path=str(Path(scratch) / "dagster.parquet")
        )
        defs = kmq_definitions([spec], kmq=kmq, audit=audit, pyspark=local_pyspark_resource())
        fill_topic(settings, topic, messages, PARTITIONS)
        report(f"{messages:,} messages of 100 bytes on {PARTITIONS} partitions")
        warm_up(settings, queues["warm-up"], scratch)
        direct = direct_throughput(settings, queues["direct"], messages, scratch)
        report(f"direct (kmq spark): {direct:,.0f} msg/s")
        dagster, runs = sensor_launched_throughput(
            defs, spec, {"kmq": kmq, "audit": audit}, messages, tick_interval_s
        )
        report(f"sensor-launched Dagster runs: {dagster:,.0f} msg/s in {runs} runs")
    return DagsterFigures(backlog_ms, observe_ms, dagster, direct, messages, runs)


def tick_times(
    settings: KmqSettings,
    kmq: KmqResource,
    audit: AuditStoreResource,
    scratch: str,
    ticks: int,
) -> tuple[float, float]:
    """Median backlog and observation tick (ms) on a 64-partition queue with a backlog and
    messages in flight."""
    queue = Queue(
        f"bench-ticks-{uuid.uuid4().hex[:8]}", "ticks", partitions=TICK_PARTITIONS,
        retry_policy=RetryPolicy.fixed(RETRY_DELAYS_MS),
    )  # fmt: skip
    opened = provision_queue(settings, queue, delay_queue=False).opened
    fill_topic(settings, queue.topic, 20_000, TICK_PARTITIONS)
    consumer = KmqConsumer(opened)
    deadline = time.monotonic() + 60
    fetched = 0
    while fetched < 2_000 and time.monotonic() < deadline:
        fetched += len(consumer.poll(0.5))  # started, never acknowledged: in flight
    consumer.close()
    spec = QueueSpec(queue, function=no_op, output_path=str(Path(scratch) / "ticks.parquet"))
    defs = kmq_definitions([spec], kmq=kmq, audit=audit)
    resources = {"kmq": kmq, "audit": audit}
    instance = DagsterInstance.ephemeral()
    timings: dict[str, list[float]] = {"backlog": [], "observe": []}
    for _ in range(ticks):
        for prefix, times in timings.items():
            started = time.perf_counter()
            result = tick(defs, spec.job_name(prefix), instance, resources)
            times.append((time.perf_counter() - started) * 1000)
            if prefix == "backlog" and not result.run_requests:
                raise KmqTimeoutError(f"the backlog sensor saw no backlog: {result.skip_reason}")
    return statistics.median(timings["backlog"]), statistics.median(timings["observe"])


def tick(defs: Definitions, name: str, instance: DagsterInstance, resources: dict[str, Any]) -> Any:
    sensor = defs.get_repository_def().get_sensor_def(name)
    with build_sensor_context(instance=instance, definitions=defs, resources=resources) as context:
        return sensor(context)


def no_op_job(
    settings: KmqSettings, queue: Queue, output_path: str, **options: Any
) -> SparkQueueJob:
    """A no-op job on the session Dagster's runs share (getOrCreate)."""
    spark = start_session(local_spark_config("kmq bench dagster"))
    opened = open_queue(settings, queue.topic, queue.group)
    return SparkQueueJob(spark, opened, function=no_op, output_path=output_path, **options)


def warm_up(settings: KmqSettings, queue: Queue, scratch: str) -> None:
    """One small batch in a group of its own, untimed: Spark starts, its Python workers start,
    and the modules they import load, before either timed path runs."""
    job = no_op_job(settings, queue, str(Path(scratch) / "warm-up.parquet"),
                    max_messages_per_partition=1_000)  # fmt: skip
    try:
        job.run_batch()
    finally:
        job.close()


def direct_throughput(settings: KmqSettings, queue: Queue, messages: int, scratch: str) -> float:
    started = time.perf_counter()
    job = no_op_job(settings, queue, str(Path(scratch) / "direct.parquet"))
    try:
        # As `kmq spark` does: batches until one reads nothing (the run sees it is idle).
        totals = run_processing(job, None, count_output=False)
        if totals.read < messages:
            raise KmqTimeoutError(f"the direct path read {totals.read:,} of {messages:,}")
        return messages / (time.perf_counter() - started)
    finally:
        job.close()


#: Runs log warnings and errors only: the benchmark prints its own progress.
QUIET_RUN = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def sensor_launched_throughput(
    defs: Definitions,
    spec: QueueSpec,
    resources: dict[str, Any],
    messages: int,
    tick_interval_s: float,
) -> tuple[float, int]:
    instance = DagsterInstance.ephemeral()
    job = defs.resolve_job_def(spec.job_name("process"))
    started = time.perf_counter()
    processed = runs = 0
    while processed < messages:
        tick_started = time.perf_counter()
        result = tick(defs, spec.job_name("backlog"), instance, resources)
        for request in result.run_requests:
            tags = {**request.tags, "dagster/run_key": request.run_key}
            run = job.execute_in_process(instance=instance, tags=tags, run_config=QUIET_RUN)
            runs += 1
            for event in run.get_asset_materialization_events():
                processed += int(event.materialization.metadata["read"].value)  # type: ignore[arg-type]
        if not result.run_requests:
            time.sleep(max(0.0, tick_interval_s - (time.perf_counter() - tick_started)))
    return messages / (time.perf_counter() - started), runs
