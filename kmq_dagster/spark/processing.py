"""The processing loop: Spark batches of a queue until it is idle, a time limit passes or a stop
is asked for, honouring the group's shared circuit breaker, with what the run did measured on
the queue's topics.

`kmq spark`, `kmq demo`, the benchmarks and the Dagster processing asset all call
:func:`run_processing`; nothing else runs batches in a loop.

The breaker (decided by the group's workers or the Dagster breaker sensor, kept in the audit
store) is checked before every batch, the first included, so before the run joins the group
(the job's lease joins on its first batch: a member that joins and leaves at once can hold up
the group's next rebalance, and the probe run after the cooldown would find no partitions):
  * OPEN: no batch starts. A run that ``waits`` (a long-running ``kmq spark``) checks again
    every :data:`BREAKER_POLL_S` and goes on once the breaker moves; otherwise the run ends
    ("breaker open") and a later run resumes.
  * HALF_OPEN: one probe batch of up to :data:`PROBE_BATCH` messages per partition, whose
    outcome the breaker's judge (sensor or workers) weighs. A waiting run then waits for the
    judge's decision; otherwise the run ends ("probed").
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql.functions import col

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import State
from kmq_dagster.core.status import QueueStatus
from kmq_dagster.operations.queue_status import measure_queue
from kmq_dagster.spark.job import COORDINATES, BatchReport, SparkQueueJob

log = logging.getLogger(__name__)

#: Messages per partition of the one batch a run processes while the breaker is half-open.
PROBE_BATCH = 5
#: What a run that the circuit breaker stopped says.
BREAKER_OPEN = "breaker open"
#: Pause after a batch that read nothing while messages wait on partitions this run does not own.
IDLE_PAUSE_S = 1.0
#: How often a run waiting for the breaker reads its state again.
BREAKER_POLL_S = 1.0


class OnOpenBreaker(enum.StrEnum):
    """What a run does while the group's breaker is open (or its probe is being judged)."""

    #: End the run; a later run resumes (a Dagster run: the backlog sensor launches the next).
    STOP = "stop"
    #: Wait for the breaker to move, then go on (a long-running ``kmq spark``).
    WAIT = "wait"


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
    #: Copies the run read from the group's redelivery topic: redelivered by the tracker, or
    #: replayed back to the group by an operator.
    redelivered: int = 0
    rows_written: int = 0
    #: Output rows of the run, deduplicated by (topic, partition, offset).
    distinct_rows: int = 0
    duration_s: float = 0.0
    #: Why the run stopped: "idle", "time limit", "stopped" (asked to), "breaker open",
    #: "no partitions" (other runs hold them all) or "probed" (one small batch while the
    #: breaker was half-open).
    stopped: str = "idle"
    #: Seconds the run spent waiting for the breaker (``OnOpenBreaker.WAIT`` only).
    breaker_wait_s: float = 0.0
    #: Whether batch ids and output files are kept, to count the output at the end (a run
    #: that keeps going does not keep them).
    counting: bool = field(default=True, repr=False)
    batch_ids: list[str] = field(default_factory=list, repr=False)
    #: The output files the batches committed; ``None`` once a batch's files were written by
    #: Spark's writer (a DataFrame transform), which names them itself.
    output_files: list[str] | None = field(default_factory=list, repr=False)
    #: Per batch: [started (epoch s), ended (epoch s), owned partitions as "topic[p]"].
    leases: list[list[object]] = field(default_factory=list, repr=False)

    def add(self, batch: BatchReport) -> None:
        """Count ``batch`` in."""
        self.batches += 1
        if self.counting:
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


def run_processing(
    job: SparkQueueJob,
    store: AuditStore | None,
    *,
    max_seconds: float | None = None,
    stop: threading.Event | None = None,
    until_idle: bool = True,
    on_open_breaker: OnOpenBreaker = OnOpenBreaker.STOP,
    on_batch: Callable[[BatchReport], None] | None = None,
    on_breaker_wait: Callable[[str], None] | None = None,
    count_output: bool = True,
) -> ProcessingReport:
    """Run ``job``'s batches until one reads nothing and nothing waits on the queue
    (``until_idle``), ``max_seconds`` have passed, ``stop`` is set, or other members of the
    group hold every partition; the group's breaker in ``store`` is honoured as the module
    says (``store=None``: no breaker).

    Args:
        until_idle: end when idle; otherwise keep polling (``kmq spark --forever``).
        on_batch: called with every batch's report (progress lines, metrics).
        on_breaker_wait: called with a one-line reason when a waiting run starts to wait.
        count_output: read the committed output back to count rows and distinct messages
            (a run that keeps going should not keep every file name).

    Returns:
        What the run did; ``stopped`` says why it ended.
    """
    loop = _Loop(job, store, stop or threading.Event(), on_open_breaker, on_breaker_wait)
    report = ProcessingReport(job.output_path, counting=count_output)
    before = measure_queue(job.opened, store=store, in_flight=False)
    after: QueueStatus | None = None
    started = time.monotonic()
    batch_cap = job.max_messages_per_partition
    try:
        while True:
            after = None  # measured in this iteration if the batch read nothing
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                report.stopped = "time limit"
                break
            gate = loop.pass_breaker(report)
            if gate is None:
                break
            # While probing, one small batch whose outcome the breaker's judge weighs.
            probing = gate is State.HALF_OPEN
            job.max_messages_per_partition = (
                min(batch_cap or PROBE_BATCH, PROBE_BATCH) if probing else batch_cap
            )
            if not job.lease.wait_for_partitions():
                if until_idle:
                    report.stopped = "no partitions"  # other members hold them all
                    break
                continue
            batch = _timed_batch(job, report)
            if on_batch is not None:
                on_batch(batch)
            loop.probed(probing)
            if batch.read == 0:
                if until_idle:
                    after = measure_queue(job.opened, store=store, in_flight=False)
                    if not _has_work(after):
                        break  # the queue is idle
                # Work waits on partitions this run does not own (yet): a rebalance in
                # progress, or other members busy with them; or nothing is there yet.
                loop.stop.wait(IDLE_PAUSE_S)
    finally:
        job.max_messages_per_partition = batch_cap
    report.duration_s = time.monotonic() - started
    if after is None:
        after = measure_queue(job.opened, store=store, in_flight=False)
    _add_topic_changes(report, before, after)
    if count_output:
        _count_output(report, job)
    return report


class _Loop:
    """The breaker's and the stop event's say in a run: whether the next batch may start."""

    def __init__(
        self,
        job: SparkQueueJob,
        store: AuditStore | None,
        stop: threading.Event,
        on_open_breaker: OnOpenBreaker,
        on_wait: Callable[[str], None] | None,
    ) -> None:
        self.queue, self.store, self.stop = job.queue, store, stop
        self.on_open_breaker, self.on_wait = on_open_breaker, on_wait
        #: The opening (opened_at_ms) of the half-open state last read, and whether this run
        #: already sent it a probe batch.
        self._opening: int | None = None
        self._probed: int | None = None

    def pass_breaker(self, report: ProcessingReport) -> State | None:
        """The breaker's state the next batch runs under (CLOSED or HALF_OPEN: a probe), or
        ``None`` when the run ends (``report.stopped`` says why). Waits while the breaker is
        open, or its probe is being judged, if the run waits."""
        while not self.stop.is_set():
            state = self._read()
            judged = state is State.HALF_OPEN and self._probed == self._opening
            if state is State.CLOSED or (state is State.HALF_OPEN and not judged):
                return state
            if self.on_open_breaker is OnOpenBreaker.STOP:
                report.stopped = BREAKER_OPEN if state is State.OPEN else "probed"
                log.warning("circuit breaker of %s is %s: no more batches", self.queue, state)
                return None
            report.breaker_wait_s += self._wait_while(state, judged)
        report.stopped = "stopped"
        return None

    def probed(self, probing: bool) -> None:
        """The batch just run was the probe of the half-open state last read."""
        if probing:
            self._probed = self._opening

    def _read(self) -> State:
        if self.store is None:
            return State.CLOSED
        row = self.store.breaker_state(self.queue.topic, self.queue.group)
        if row is None:
            return State.CLOSED
        self._opening = row.opened_at_ms
        return State(row.state)

    def _wait_while(self, state: State, judged: bool) -> float:
        """Wait until the stored breaker leaves ``state`` (or a stop); returns the seconds."""
        why = "its probe batch is being judged" if judged else "no batch starts"
        if self.on_wait is not None:
            self.on_wait(f"circuit breaker of {self.queue} is {state}: {why}; waiting")
        began, opening = time.monotonic(), self._opening
        while not self.stop.wait(BREAKER_POLL_S):
            if self._read() is not state or self._opening != opening:
                break
        return time.monotonic() - began


def _timed_batch(job: SparkQueueJob, report: ProcessingReport) -> BatchReport:
    """One batch, its lease (what it may have read) noted in ``report``."""
    batch_started = time.time()
    owned = sorted(f"{t}[{p}]" for t, p in job.lease.owned())
    batch = job.run_batch()
    # What the batch may have read: owned when it started (it reads what it owns then).
    report.leases.append([round(batch_started, 3), round(time.time(), 3), owned])
    if {f"{t}[{p}]" for t, p in job.lease.owned()} != set(owned):
        log.info("the group moved partitions during batch %s", batch.batch_id)
    report.add(batch)
    return batch


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
