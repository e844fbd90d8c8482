"""What Spark tasks run on the executors: read a few partitions' slices, process them chunk by
chunk, stage the output, report offsets and counts.

The task's part of docs/design.md, "The protocol" (Spark variant), per chunk (a few hundred
records of one partition, in offset order): step 1, read it
(:class:`~kmq_dagster.kafka.slice_reader.SliceReader`); step 2, write its start markers; call
the function per message, up to the job's concurrency at once in its ordering
(:mod:`~kmq_dagster.spark.concurrent_calls`), or, for a DataFrame transform, keep the messages
as rows; step 4 for failures, once their retry or dead-letter copy is durable; append the
successes to the task's staged Parquet file. Before it reports, the task waits until its start
markers are durable, so that the driver's step 3 keeps invariant 2. Successes are acknowledged
by the driver (step 4), after the batch's files are committed (invariant 3).
A task stops taking chunks when the batch's time is up, so a batch fits its visibility timeout.
Payloads stay on the executors and in the sink; the driver gets offsets, counts and file names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.ranges import extend_runs, offset_runs, source_runs
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.record_columns import Record, record_columns
from kmq_dagster.kafka.slice_reader import Slice, SliceReader
from kmq_dagster.spark.concurrent_calls import ChunkCaller, chunk_caller
from kmq_dagster.spark.message import SparkMessage, spark_message_class, spark_messages
from kmq_dagster.spark.process import Function, message_rows, output_columns
from kmq_dagster.spark.sink import INPUT_COLUMNS, OUTPUT_COLUMNS, ParquetSink, StagedFile

__all__ = ["Function", "Slice", "SparkMessage", "TaskConfig", "TaskReport", "run_task"]

#: However late a task starts, it may work this long (so every batch makes progress).
MIN_TASK_S = 1.0

T = TypeVar("T")


@dataclass(frozen=True)
class TaskConfig:
    """What every task of a job needs: the opened queue (where Kafka is, the queue, the retry
    policy in use) and how many calls of a per-message function run at once, in what order
    (see :mod:`~kmq_dagster.spark.concurrent_calls`)."""

    opened: OpenedQueue
    concurrency: int = 1
    ordering: Ordering = Ordering.PARTITION

    @property
    def visibility_timeout_ms(self) -> int:
        return self.opened.queue.visibility_timeout_ms


@dataclass(frozen=True)
class BatchPlan:
    """What every task of one batch shares."""

    batch_id: str
    sink: ParquetSink
    #: Wall-clock time (ms since the epoch) after which tasks take no new chunk.
    stop_at_ms: int


@dataclass
class SliceOutcome:
    """What a task did with one slice: offsets and counts only."""

    topic: str
    partition: int
    #: Where the group's offset goes once the batch commits.
    next_offset: int
    read: int = 0
    succeeded: int = 0
    failed: int = 0
    #: ``(first offset, count)`` runs to acknowledge once the batch's files are committed:
    #: one per stretch between failures, however many messages.
    pending_acks: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class TaskReport:
    slices: list[SliceOutcome]
    #: Staged files (paths on the sink's filesystem) holding the task's rows.
    staged: list[str] = field(default_factory=list)
    #: Seconds spent per phase: read, function, start_markers, route, write.
    timings_s: dict[str, float] = field(default_factory=dict)
    #: Seconds from the task's start to its report.
    wall_s: float = 0.0


def run_task(
    slices: list[Slice], config: TaskConfig, plan: BatchPlan, function: Function
) -> TaskReport:
    """Process ``slices`` with ``function``; stage the successes' rows for the driver."""
    return _Task(slices, config, plan).run(function)


def stage_task(slices: list[Slice], config: TaskConfig, plan: BatchPlan) -> TaskReport:
    """For a DataFrame transform: read ``slices``, write their start markers and stage one row
    per message; every message read is acknowledged once the transform's output is written."""
    return _Task(slices, config, plan).run(None)


class _Task:
    def __init__(self, slices: list[Slice], config: TaskConfig, plan: BatchPlan) -> None:
        self.config, self.plan, self.slices = config, plan, slices
        left_s = (plan.stop_at_ms - wall_clock_ms()) / 1000
        self.stop_at = time.monotonic() + max(left_s, MIN_TASK_S)
        # Every message of this task is acknowledged at the end of the batch at the latest, so
        # one deadline from the task's start covers them all.
        self.deadline_ms = wall_clock_ms() + config.visibility_timeout_ms
        self.report = TaskReport(
            [SliceOutcome(w.topic, w.partition, w.start_offset) for w in slices]
        )
        self.timings = dict.fromkeys(("read", "function", "start_markers", "route", "write"), 0.0)
        self.report.timings_s = self.timings
        self.markers = MarkerWriter(config.opened.settings, config.opened.queue.markers_topic)
        #: Messages of a queue with a declared format can decode themselves.
        self._message_type = spark_message_class(config.opened.codecs)

    def run(self, function: Function | None) -> TaskReport:
        began = time.perf_counter()
        reader = SliceReader(self.config.opened.settings, self.slices, self.stop_at)
        self.timings["read"] += time.perf_counter() - began
        rows = StagedFile(
            self.plan.sink,
            self.plan.batch_id,
            INPUT_COLUMNS if function is None else OUTPUT_COLUMNS,
        )
        outcomes = {(o.topic, o.partition): o for o in self.report.slices}
        config = self.config
        calls = (
            None
            if function is None
            else chunk_caller(function, config.concurrency, config.ordering, config.opened.group)
        )
        try:
            for work, records in self._timed(reader.chunks(), "read"):
                outcome = outcomes[work.source]
                done = self._chunk(work, records, calls, outcome, rows)
                reader.used(done)
                outcome.read += done
            for outcome in self.report.slices:
                outcome.next_offset = reader.next_offset[(outcome.topic, outcome.partition)]
            started = time.perf_counter()
            self.markers.wait()  # start markers durable before the driver commits offsets
            self.timings["start_markers"] += time.perf_counter() - started
            started = time.perf_counter()
            rows.close()
            self.timings["write"] += time.perf_counter() - started
        finally:
            if calls is not None:
                calls.close()
            started = time.perf_counter()
            reader.close()
            self.timings["read"] += time.perf_counter() - started
        if rows.path is not None:
            self.report.staged.append(rows.path)
        self.report.wall_s = time.perf_counter() - began
        return self.report

    def _chunk(
        self,
        work: Slice,
        records: list[Record],
        calls: ChunkCaller | None,
        slice_: SliceOutcome,
        rows: StagedFile,
    ) -> int:
        """Everything after step 1 for one chunk; returns how many of its records were done."""
        clock, timings = time.perf_counter, self.timings
        started = clock()
        columns = record_columns(records)
        runs = offset_runs(columns.offsets)
        timings["read"] += clock() - started
        self._write_markers(work, runs, start=True)
        started = clock()
        messages = spark_messages(work.topic, work.partition, columns, self._message_type)
        if calls is None:
            extend_runs(slice_.pending_acks, runs)
            timings["function"] += clock() - started
            started = clock()
            rows.append(message_rows(messages))
            timings["write"] += clock() - started
            return len(records)
        check = _metadata_check(self.config) if work.gated or any(columns.raw_headers) else None
        outcome = calls(messages, self.stop_at, check)
        done = outcome.done
        timings["function"] += clock() - started
        done_offsets = columns.offsets[:done]
        if done < len(records):
            # Time is up mid-chunk. The rest is not committed, so the next batch reads it
            # again; its end markers only keep the tracker from redelivering it as well.
            self._write_markers(work, offset_runs(columns.offsets[done:]), start=False)
        if outcome.failed:
            started = clock()
            routed = _router(self.config).route(outcome.failed)
            self._write_markers(work, offset_runs([m.offset for m in routed]), start=False)
            timings["route"] += clock() - started
            ok = [o for o, good in zip(done_offsets, outcome.succeeded(), strict=True) if good]
            ok_runs = offset_runs(ok)
        else:
            ok = done_offsets
            ok_runs = runs if done == len(records) else offset_runs(ok)
        extend_runs(slice_.pending_acks, ok_runs)
        slice_.succeeded += len(ok)
        slice_.failed += len(outcome.failed)
        started = clock()
        rows.append(output_columns(messages, outcome, columns, self.plan.batch_id))
        timings["write"] += clock() - started
        return done

    def _write_markers(self, work: Slice, runs: list[tuple[int, int]], *, start: bool) -> None:
        """Step 2 (``start``): start markers, before the chunk is processed; or step 4: end
        markers."""
        started = time.perf_counter()
        if start:
            self.markers.start(source_runs(work.source, runs), self.deadline_ms)
        else:
            self.markers.end(source_runs(work.source, runs))
        self.timings["start_markers" if start else "route"] += time.perf_counter() - started

    def _timed(self, items: Iterable[T], phase: str) -> Iterator[T]:
        iterator = iter(items)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.timings[phase] += time.perf_counter() - started
                return
            self.timings[phase] += time.perf_counter() - started
            yield item


#: One retry router per executor process and queue: it holds a producer (as the markers' one,
#: :func:`~kmq_dagster.kafka.marker_writer.process_producer`).
_ROUTERS: dict[str, Any] = {}


def _router(config: TaskConfig) -> Any:
    from kmq_dagster.kafka.retry_router import RetryRouter

    key = json.dumps(
        [
            config.opened.settings.producer_config(),
            repr(config.opened.queue),
            repr(config.opened.queue.retry_policy),
        ],
        sort_keys=True,
        default=str,
    )
    if key not in _ROUTERS:
        _ROUTERS[key] = RetryRouter(config.opened, clock_ms=wall_clock_ms)
    return _ROUTERS[key]


def _metadata_check(config: TaskConfig) -> Callable[[SparkMessage], str | None]:
    check: Callable[[SparkMessage], str | None] = _router(config).metadata_problem
    return check
