"""The driver side: one batch = one Spark job over the partitions this job owns, a sink commit,
then acknowledgements, then offset commits.

The driver's part of docs/design.md, "The protocol" (Spark variant), per batch:
  * the tasks do steps 1 and 2, process each message, do step 4 for failures and stage the
    successes' rows as Parquet files, and report once their start markers are durable (see
    tasks.py);
  * the driver commits the staged files to the sink (for a DataFrame transform: runs the
    transform over the staged messages and writes its output with Spark's writer);
  * only then step 4 for the successes: end markers, offset runs, no payloads (invariant 3);
  * then step 3: the group's offsets past the slices, through its group lease (invariant 2:
    every start marker is durable since the tasks reported).
A driver killed anywhere in between loses nothing: messages with start markers and no end
markers are redelivered by the tracker, uncommitted offsets are read again; the output may hold
duplicates, which its (topic, partition, offset) columns identify.

A batch lasts about a third of the visibility timeout: tasks take no new chunk after that, so
the messages they started are acknowledged long before their deadline, whatever the function
costs per message. ``max_messages_per_partition`` caps a batch besides.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import lit
from pyspark.sql.pandas.types import from_arrow_schema

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue_settings import CONCURRENCY, setting_named
from kmq_dagster.core.ranges import source_runs
from kmq_dagster.errors import ConfigError, KmqTimeoutError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.group_lease import GroupLease
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.slice_reader import Slice
from kmq_dagster.spark.concurrent_calls import check_concurrency
from kmq_dagster.spark.sink import INPUT_COLUMNS, OUTPUT_COLUMNS, ParquetSink
from kmq_dagster.spark.tasks import (
    BatchPlan,
    Function,
    TaskConfig,
    TaskReport,
    run_task,
    stage_task,
)

log = logging.getLogger(__name__)

#: Share of the visibility timeout a batch's tasks may spend reading and processing; the rest
#: covers the sink commit, the acknowledgements and Spark's scheduling.
BATCH_SHARE_OF_VISIBILITY = 1 / 3

#: The output's columns and those a transform gets, as Spark types: the Parquet sink's, which
#: the tasks write (sink.py describes each column once).
OUTPUT_SCHEMA = from_arrow_schema(OUTPUT_COLUMNS)
INPUT_SCHEMA = from_arrow_schema(INPUT_COLUMNS)
#: A transform must keep these, so that its output can be deduplicated.
COORDINATES = ("topic", "partition", "offset")

Transform = Callable[[DataFrame], DataFrame]


@dataclass
class BatchReport:
    batch_id: str
    slices: int
    read: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Partitions the group moved away during the batch: their offsets were not committed.
    lost_partitions: int = 0
    #: Where the batch's time went, in ms: task phases (read, function, start_markers, route,
    #: write) summed over the tasks, which run in parallel; driver phases (job, commit, ack,
    #: offsets) as wall time. ``job`` is the Spark job from submission to the last result,
    #: ``spark`` the part of it beyond the longest task.
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: The output files the batch committed (a per-message function's); ``None`` when Spark's
    #: writer wrote them (a DataFrame transform's).
    output_files: list[str] | None = None


class SparkQueueJob:
    """Process the opened queue on Spark, writing results to ``output_path``.

    Args:
        function: called per message on the executors; its return value is the result.
        transform: instead of ``function``, a DataFrame transform of the whole batch.
        max_messages_per_partition: a cap per partition and batch; by default a batch takes
            what a third of the queue's visibility timeout allows.
        concurrency: calls of ``function`` at once per Spark task, for functions that wait on
            I/O: a sync function runs on a thread pool of this size, an ``async def`` one as
            tasks on one event loop per Spark task. 1 (the default) calls one at a time, as
            before. Not for a ``transform``.
        ordering: with ``concurrency`` above 1, which messages of a chunk (one partition's) may
            run together: ``key`` (never two of one key at once, one key's in offset order),
            ``unordered``, or ``partition`` (one at a time: the default, as the worker's).
            Acknowledgements still follow the sink commit of the batch.

    Raises:
        ConfigError: both or neither of ``function`` and ``transform``; concurrency or an
            ordering for a transform; a generator function; a bad limit.

    Examples:
        >>> job = SparkQueueJob(spark, open_queue(settings, "orders", "billing"),
        ...                     function=price, output_path="/data/priced")  # doctest: +SKIP
        >>> run_processing(job, store)   # batches until idle   # doctest: +SKIP
        >>> job.close()            # doctest: +SKIP
    """

    def __init__(
        self,
        spark: SparkSession,
        opened: OpenedQueue,
        *,
        output_path: str,
        function: Function | None = None,
        transform: Transform | None = None,
        max_messages_per_partition: int | None = None,
        concurrency: int = 1,
        ordering: Ordering | str = Ordering.PARTITION,
    ) -> None:
        if (function is None) == (transform is None):
            raise ConfigError("give the job a per-message function or a DataFrame transform")
        CONCURRENCY.check(concurrency)  # the bounds every front end checks
        setting_named("max_messages_per_partition").check(max_messages_per_partition)
        self.ordering = check_concurrency(
            concurrency, ordering, function=function, transform=transform is not None
        )
        self.concurrency = concurrency
        self.queue = queue = opened.queue
        settings = opened.settings
        self.opened = opened
        self.spark = spark
        self.transform = transform
        self.topic = queue.topic
        self.group = queue.group
        self.function = function
        self.output_path = output_path
        self.sink = ParquetSink(output_path)
        #: ``None``: as many as a third of the visibility timeout allows.
        self.max_messages_per_partition = max_messages_per_partition
        self.retry_topics = list(queue.retry_topics.values())
        self.config = TaskConfig(opened, concurrency, self.ordering)
        self.lease = GroupLease(settings, queue.consumed_topics, queue.group)
        # Made now: its producer gets its id before the first batch, not in it.
        self._acks = MarkerWriter(settings, queue.markers_topic)

    def run_batch(self, wait_for_partitions_s: float = 60.0) -> BatchReport:
        """Process what every owned partition holds, for up to a third of the visibility
        timeout (and up to ``max_messages_per_partition`` each).

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
        most = self.max_messages_per_partition or 2**62
        slices = [Slice(t, p, committed[(t, p)], most, t in self.retry_topics) for t, p in owned]
        report = BatchReport(uuid.uuid4().hex[:12], len(slices))
        budget_ms = int(self.config.visibility_timeout_ms * BATCH_SHARE_OF_VISIBILITY)
        plan = BatchPlan(report.batch_id, self.sink, stop_at_ms=wall_clock_ms() + budget_ms)
        timings = report.timings_ms
        try:
            started = time.perf_counter()
            tasks = self._run_tasks(_by_partition_number(slices), plan)
            timings["job"] = _ms_since(started)
            # Spark's part: the job's time beyond its longest task (scheduling, serialization,
            # Python workers starting).
            timings["spark"] = timings["job"] - 1000 * max((t.wall_s for t in tasks), default=0)
            for phase in ("read", "function", "start_markers", "route", "write"):
                timings[phase] = 1000 * sum(task.timings_s.get(phase, 0.0) for task in tasks)
            started = time.perf_counter()
            report.output_files = self._commit_output(tasks, report.batch_id)  # the effect
            timings["commit"] = _ms_since(started)
        finally:
            self.sink.discard(report.batch_id)
        outcomes = [outcome for task in tasks for outcome in task.slices]
        started = time.perf_counter()
        for o in outcomes:  # 4.
            self._acks.end(source_runs((o.topic, o.partition), o.pending_acks))
        self._acks.wait()
        timings["ack"] = _ms_since(started)
        started = time.perf_counter()
        next_offsets = {(o.topic, o.partition): o.next_offset for o in outcomes if o.read}
        report.lost_partitions = len(self.lease.commit(next_offsets))  # 3.
        timings["offsets"] = _ms_since(started)
        report.read = sum(o.read for o in outcomes)
        report.succeeded = sum(o.succeeded for o in outcomes)
        report.failed = sum(o.failed for o in outcomes)
        report.timings_ms = {phase: round(ms, 1) for phase, ms in timings.items()}
        log.info("batch %s: %s", report.batch_id, report)
        return report

    def _run_tasks(self, groups: list[list[Slice]], plan: BatchPlan) -> list[TaskReport]:
        """Steps 1 and 2 in one Spark task per group of slices; only offsets, counts and names
        come back."""
        config, function = self.config, self.function
        work = self.spark.sparkContext.parallelize(groups, max(1, len(groups)))
        if function is None:
            return work.map(lambda group: stage_task(group, config, plan)).collect()
        return work.map(lambda group: run_task(group, config, plan, function)).collect()

    def _commit_output(self, tasks: list[TaskReport], batch_id: str) -> list[str] | None:
        """The sink write (the effect); it must commit before anything is acknowledged. Returns the
        committed files, or ``None`` when Spark's writer wrote them."""
        staged = [path for task in tasks for path in task.staged]
        if self.transform is None:
            return self.sink.commit(staged)
        if not staged:
            return None
        paths = [self.sink.spark_path(path) for path in staged]
        frame = self.transform(self.spark.read.schema(INPUT_SCHEMA).parquet(*paths))
        missing = [name for name in COORDINATES if name not in frame.columns]
        if missing:
            raise ConfigError(
                f"the transform's output lacks {', '.join(missing)}: keep the coordinates "
                "so duplicates can be removed"
            )
        frame.withColumn("batch_id", lit(batch_id)).write.mode("append").parquet(self.output_path)
        return None

    def warm_up(self) -> None:
        """Start Spark's Python workers and import the task code in them (otherwise the first
        batch does it, in the time of its visibility timeout)."""
        cores = self.spark.sparkContext.defaultParallelism
        self.spark.sparkContext.parallelize(range(cores), cores).map(_import_tasks).collect()

    def close(self) -> None:
        self.lease.close()


def _by_partition_number(slices: list[Slice]) -> list[list[Slice]]:
    """One task per partition number: a queue partition and the redelivery and retry
    partitions of the same number are read together, by one consumer."""
    groups: dict[int, list[Slice]] = defaultdict(list)
    for work in slices:
        groups[work.partition].append(work)
    return [groups[number] for number in sorted(groups)]


def _import_tasks(_index: int) -> bool:
    import kmq_dagster.spark.tasks  # noqa: F401

    return True


def _ms_since(started: float) -> float:
    return 1000 * (time.perf_counter() - started)
