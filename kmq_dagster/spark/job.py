"""The driver side: one batch = Spark tasks over the partitions this job owns, a sink write,
then acknowledgements, then offset commits.

Order per batch (invariants 2 and 3):
  1. tasks read their slices, write start markers (durable), process each message, send
     failures to the retry topic or the DLQ and acknowledge those;
  2. the driver writes the successes to the sink (Parquet by default);
  3. only then tasks acknowledge the successes (end markers);
  4. the driver commits the group's offsets past the slices, through its group lease.
A driver killed anywhere in between loses nothing: messages with start markers and no end
markers are redelivered by the tracker, uncommitted offsets are read again; the output may hold
duplicates, which its (topic, partition, offset) columns identify.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark import RDD, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import lit
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import ConfigError, KmqTimeoutError
from kmq_dagster.kafka.group_lease import GroupLease
from kmq_dagster.kafka.queues import ensure_provisioned
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.tasks import (
    Function,
    Row,
    Slice,
    TaskConfig,
    acknowledge,
    read_slice,
    run_slice,
)

log = logging.getLogger(__name__)

#: Columns of the output: where each message was first produced, its key, the function's result.
OUTPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("key", BinaryType()),
        StructField("result", StringType()),
        StructField("batch_id", StringType(), nullable=False),
    ]
)


#: Columns of the DataFrame a transform gets: one row per message of the batch.
INPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp_ms", LongType(), nullable=False),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("name", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)
#: A transform must keep these, so that its output can be deduplicated.
COORDINATES = ("topic", "partition", "offset")

Transform = Callable[[DataFrame], DataFrame]


@dataclass
class RunTotals:
    """What several batches did, added up."""

    batches: int = 0
    read: int = 0
    succeeded: int = 0
    failed: int = 0

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        self.read += report.read
        self.succeeded += report.succeeded
        self.failed += report.failed


@dataclass
class BatchReport:
    batch_id: str
    slices: int
    read: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Partitions the group moved away during the batch: their offsets were not committed.
    lost_partitions: int = 0


class SparkQueueJob:
    """Process ``queue`` on Spark, writing results to ``output_path``.

    Args:
        function: called per message on the executors; its return value is the result.
        transform: instead of ``function``, a DataFrame transform of the whole batch.
        policy: the queue's retry policy unless given; it may differ only in which error
            types are fatal.
        max_messages_per_partition: messages per partition and batch (a batch must finish
            within the queue's visibility timeout).

    Examples:
        >>> job = SparkQueueJob(spark, settings, open_queue(settings, "orders", "billing"),
        ...                     function=price, output_path="/data/priced")  # doctest: +SKIP
        >>> job.run_until_idle()   # doctest: +SKIP
        >>> job.close()            # doctest: +SKIP
    """

    def __init__(
        self,
        spark: SparkSession,
        settings: KmqSettings,
        queue: Queue,
        *,
        output_path: str,
        function: Function | None = None,
        transform: Transform | None = None,
        policy: RetryPolicy | None = None,
        max_messages_per_partition: int = 50_000,
    ) -> None:
        if (function is None) == (transform is None):
            raise ConfigError("give the job a per-message function or a DataFrame transform")
        if max_messages_per_partition < 1:
            raise ConfigError(
                "max messages per partition must be at least 1",
                setting="max_messages_per_partition",
            )
        self.queue = queue = ensure_provisioned(settings, queue)
        self.spark = spark
        self.transform = transform
        self.topic = queue.topic
        self.group = queue.group
        self.function = function
        self.output_path = output_path
        self.max_messages_per_partition = max_messages_per_partition
        self.retry_topics = list(queue.retry_topics.values())
        self.config = TaskConfig(settings, queue, policy or queue.retry_policy)
        self.lease = GroupLease(settings, queue.consumed_topics, queue.group)

    def run_batch(self, wait_for_partitions_s: float = 60.0) -> BatchReport:
        """Process up to ``max_messages_per_partition`` from every owned partition.

        Raises:
            KmqTimeoutError: the group gave this job no partition in time.
        """
        if not self.lease.wait_for_partitions(wait_for_partitions_s):
            raise KmqTimeoutError(
                f"group {self.group} gave this job no partition within "
                f"{wait_for_partitions_s:g} s (are other members holding them all?)"
            )
        owned = sorted(self.lease.owned())
        committed = self.lease.committed(owned)
        slices = [
            Slice(t, p, committed[(t, p)], self.max_messages_per_partition, t in self.retry_topics)
            for t, p in owned
        ]
        report = BatchReport(uuid.uuid4().hex[:12], len(slices))
        config, function, batch_id = self.config, self.function, report.batch_id
        transform = self.transform
        tasks = self.spark.sparkContext.parallelize(slices, len(slices))
        rows: RDD[Any]
        if transform is None:
            assert function is not None
            rows = tasks.flatMap(lambda work: run_slice(work, config, function))
        else:
            rows = tasks.flatMap(lambda work: read_slice(work, config))
        rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._write_output(rows, batch_id)
            done = rows.filter(lambda row: row[0] == "done")
            done.foreachPartition(lambda part: acknowledge(part, config))
            summaries = done.map(_summary).collect()  # offsets and counts only, no payloads
        finally:
            rows.unpersist()
        for _source, _next, counts in summaries:
            report.read += counts["read"]
            report.succeeded += counts["succeeded"]
            report.failed += counts["failed"]
        next_offsets = {source: next_offset for source, next_offset, _ in summaries}
        report.lost_partitions = len(self.lease.commit(next_offsets))
        log.info("batch %s: %s", report.batch_id, report)
        return report

    def _write_output(self, rows: RDD[Any], batch_id: str) -> None:
        """2. The sink write; it must commit before anything is acknowledged."""
        if self.transform is None:
            successes = rows.filter(lambda row: row[0] == "ok").map(
                lambda row: (row[1], row[2], row[3], row[4], row[5], batch_id)
            )
            frame = self.spark.createDataFrame(successes, OUTPUT_SCHEMA)
        else:
            messages = rows.filter(lambda row: row[0] == "msg").map(lambda row: row[1:])
            frame = self.transform(self.spark.createDataFrame(messages, INPUT_SCHEMA))
            missing = [name for name in COORDINATES if name not in frame.columns]
            if missing:
                raise ConfigError(
                    f"the transform's output lacks {', '.join(missing)}: keep the coordinates "
                    "so duplicates can be removed"
                )
            frame = frame.withColumn("batch_id", lit(batch_id))
        frame.write.mode("append").parquet(self.output_path)

    def run(
        self,
        stop: threading.Event,
        *,
        until_idle: bool = True,
        on_batch: Callable[[BatchReport], None] | None = None,
        idle_wait_s: float = 1.0,
    ) -> RunTotals:
        """Run batches until ``stop`` is set, or (``until_idle``) until one reads nothing.

        Returns:
            The totals over every batch.
        """
        totals = RunTotals()
        while not stop.is_set():
            report = self.run_batch()
            totals.add(report)
            if on_batch is not None:
                on_batch(report)
            if report.read == 0:
                if until_idle:
                    break
                stop.wait(idle_wait_s)
        return totals

    def run_until_idle(self) -> RunTotals:
        """Run batches until one reads nothing; returns the totals."""
        return self.run(threading.Event())

    def close(self) -> None:
        self.lease.close()


def _summary(row: Row) -> tuple[tuple[str, int], int, dict[str, Any]]:
    _kind, topic, partition, next_offset, _key, detail = row
    return (topic, partition), next_offset, json.loads(detail)
