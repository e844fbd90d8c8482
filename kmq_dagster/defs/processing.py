"""A processing run: Spark batches of a queue until it is idle, a time limit passes or the
circuit breaker opens, with what the run did measured on the queue's topics.

Not Dagster-specific: the processing asset calls :func:`run_processing`, and so can any other
front end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql.functions import col

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.status import QueueStatus
from kmq_dagster.errors import ProvisionError
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queue_status import measure_queue
from kmq_dagster.kafka.queues import OpenedQueue, open_declared_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import COORDINATES, BatchReport, SparkQueueJob

log = logging.getLogger(__name__)

#: Messages per partition of the one batch a run processes while the breaker is half-open.
PROBE_BATCH = 5
#: What a run that the circuit breaker stopped says.
BREAKER_OPEN = "breaker open"
#: Pause after a batch that read nothing while messages wait on partitions this run does not own.
IDLE_PAUSE_S = 1.0


@dataclass
class ProcessingReport:
    """What one processing run did."""

    output_path: str
    batches: int = 0
    read: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Copies the group's retry topics received during the run.
    retried: int = 0
    #: Copies the group's DLQ received during the run (the tracker's included).
    dead_lettered: int = 0
    #: Redelivered copies the run read.
    redelivered: int = 0
    rows_written: int = 0
    #: Output rows of the run, deduplicated by (topic, partition, offset).
    distinct_rows: int = 0
    duration_s: float = 0.0
    #: Why the run stopped: "idle", "time limit", "breaker open", "no partitions" (other runs
    #: hold them all) or "probed" (one small batch while the breaker was half-open).
    stopped: str = "idle"
    batch_ids: list[str] = field(default_factory=list)
    #: The output files the batches committed; ``None`` once a batch's files were written by
    #: Spark's writer (a DataFrame transform), which names them itself.
    output_files: list[str] | None = field(default_factory=list, repr=False)
    #: Per batch: [started (epoch s), ended (epoch s), owned partitions as "topic[p]"].
    leases: list[list[object]] = field(default_factory=list)

    def add(self, batch: BatchReport) -> None:
        """Count ``batch`` in."""
        self.batches += 1
        self.batch_ids.append(batch.batch_id)
        if batch.output_files is None or self.output_files is None:
            self.output_files = None
        else:
            self.output_files += batch.output_files
        self.read += batch.read
        self.succeeded += batch.succeeded
        self.failed += batch.failed

    @property
    def msgs_per_s(self) -> float:
        return self.read / self.duration_s if self.duration_s > 0 else 0.0


def ensure_queue(settings: KmqSettings, queue: Queue) -> OpenedQueue:
    """``queue`` opened as provisioned; provisioned now if it never was (first use).

    Raises:
        QueueConflictError: the queue is provisioned with other settings.
    """
    try:
        return open_declared_queue(settings, queue)
    except ProvisionError:
        log.info("queue %s is not provisioned yet: provisioning it", queue)
        return provision_queue(settings, queue).opened


def run_processing(
    job: SparkQueueJob,
    settings: KmqSettings,
    store: AuditStore,
    *,
    max_seconds: float,
    on_batch: Callable[[BatchReport], None] | None = None,
) -> ProcessingReport:
    """Run ``job``'s batches until one reads nothing and nothing waits on the queue,
    ``max_seconds`` have passed, other members of the group hold every partition, or the
    group's shared circuit breaker is open (checked before every batch). While the breaker is
    half-open the run is a probe: one batch of up to :data:`PROBE_BATCH` messages per
    partition."""
    queue = job.queue
    report = ProcessingReport(job.output_path)
    before = measure_queue(job.opened, store=store, in_flight=False)
    started = time.monotonic()
    while True:
        after: QueueStatus | None = None  # measured in the last iteration, if the batch was empty
        if time.monotonic() - started >= max_seconds:
            report.stopped = "time limit"
            break
        breaker = store.breaker_state(queue.topic, queue.group)
        if breaker is not None and breaker.state == "open":
            report.stopped = BREAKER_OPEN
            log.warning("circuit breaker of %s is open: no more batches in this run", queue)
            break
        probing = breaker is not None and breaker.state == "half_open"
        if probing:  # one small batch, whose outcome the breaker sensor judges
            job.max_messages_per_partition = min(
                job.max_messages_per_partition or PROBE_BATCH, PROBE_BATCH
            )
        if not job.lease.wait_for_partitions():
            report.stopped = "no partitions"  # other members of the group hold them all
            break
        batch_started = time.time()
        owned = sorted(f"{t}[{p}]" for t, p in job.lease.owned())
        batch = job.run_batch()
        owned_after = {f"{t}[{p}]" for t, p in job.lease.owned()}
        # What the batch may have read: owned when it started (it reads what it owns then).
        report.leases.append([round(batch_started, 3), round(time.time(), 3), owned])
        if owned_after != set(owned):
            log.info("the group moved partitions during batch %s", batch.batch_id)
        report.add(batch)
        if on_batch is not None:
            on_batch(batch)
        if batch.read == 0:
            after = measure_queue(job.opened, store=store, in_flight=False)
            if not _has_work(after):
                break  # the queue is idle
            # Work waits on partitions this run does not own (yet): a rebalance in progress,
            # or other members of the group busy with them.
            time.sleep(IDLE_PAUSE_S)
        if probing:
            report.stopped = "probed"
            break
    report.duration_s = time.monotonic() - started
    if after is None:
        after = measure_queue(job.opened, store=store, in_flight=False)
    _add_topic_changes(report, before, after)
    _count_output(report, job)
    return report


def stopped_by_open_breaker(
    store: AuditStore, queue: Queue, output_path: str
) -> ProcessingReport | None:
    """The report of a run that does not start because the group's breaker is open (``None``
    when it may start). Checked before the run joins the group: a member that joins and
    leaves at once can hold up the group's next rebalance (a pending join waits out the
    coordinator's rebalance timeout), and the probe run after the cooldown would find no
    partitions."""
    breaker = store.breaker_state(queue.topic, queue.group)
    if breaker is None or breaker.state != "open":
        return None
    log.warning("circuit breaker of %s is open: the run processes nothing", queue)
    report = ProcessingReport(output_path)
    report.stopped = BREAKER_OPEN
    return report


def _has_work(status: QueueStatus) -> bool:
    """Whether messages wait on any of the queue's or redelivery partitions (retry copies wait
    for their due time, so they are left out). Another run, or a worker of the group, may own
    them now; the group may give them to this run at its next rebalance."""
    return any(p.pending > 0 for p in (*status.lags, *status.redelivery))


def _add_topic_changes(report: ProcessingReport, before: QueueStatus, after: QueueStatus) -> None:
    retry_ends = sum(p.end_offset for p in after.retries) - sum(
        p.end_offset for p in before.retries
    )
    report.retried = max(0, retry_ends)
    report.dead_lettered = max(0, after.dlq_depth - before.dlq_depth)
    redelivered = sum(p.committed for p in after.redelivery)
    report.redelivered = max(0, redelivered - sum(p.committed for p in before.redelivery))


def _count_output(report: ProcessingReport, job: SparkQueueJob) -> None:
    """Rows the run's batches wrote, and how many distinct messages they are: read back from
    the files the batches committed (with pyarrow: a Spark job over them costs seconds), or
    with Spark by batch id where Spark's writer named the files."""
    if report.succeeded == 0 and report.read == 0:
        return
    if report.output_files is not None:
        report.rows_written, report.distinct_rows = job.sink.count_rows(
            report.output_files, COORDINATES
        )
        return
    try:
        frame = job.spark.read.parquet(report.output_path)
    except Exception:  # nothing written yet: a run of failures only
        log.info("no output at %s yet", report.output_path, exc_info=True)
        return
    mine = frame.where(col("batch_id").isin(report.batch_ids))
    report.rows_written = mine.count()
    report.distinct_rows = mine.select(*COORDINATES).distinct().count()
