"""What one Spark task does, run in this process against the real broker: it reads the slices
of one partition number with one consumer, writes start markers, stages its rows, and reports
offsets, counts and runs, never payloads."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kmq_dagster.core.markers import EndMarker, StartMarker, decode_marker
from kmq_dagster.core.naming import markers_topic, redelivery_topic
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.slice_reader import Slice
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.message import SparkMessage
from kmq_dagster.spark.sink import ParquetSink
from kmq_dagster.spark.tasks import BatchPlan, TaskConfig, run_task
from tests.kafka_helpers import new_queue, produce, read_topic

pytestmark = [pytest.mark.kafka]

GROUP = "tasks"


@pytest.fixture
def config(settings: KmqSettings, topic_name: str) -> TaskConfig:
    queue = new_queue(settings, topic_name, GROUP, retry_delays_ms=(1_000,))
    return TaskConfig(queue)


def plan(tmp_path: Path, seconds: float = 30) -> BatchPlan:
    return BatchPlan("b1", ParquetSink(str(tmp_path / "out")), wall_clock_ms() + int(seconds * 1e3))


def topic_holding(settings: KmqSettings, config: TaskConfig, messages: int) -> str:
    """The queue topic, once the messages ``0`` to ``messages - 1`` are on it."""
    produce(settings, config.opened.topic, [str(i).encode() for i in range(messages)])
    return config.opened.topic


def markers(settings: KmqSettings, topic: str) -> list[StartMarker | EndMarker]:
    return [
        decode_marker(r.value() or b"")
        for r in read_topic(settings, markers_topic(topic, GROUP), 1)
    ]


def test_a_task_reports_runs_and_counts_whatever_the_number_of_messages(
    config: TaskConfig, settings: KmqSettings, tmp_path: Path
) -> None:
    topic = topic_holding(settings, config, 5_000)
    produce(settings, redelivery_topic(topic, GROUP), [b"again"], headers=[("x", b"1")])
    slices = [Slice(topic, 0, 0, 10**9), Slice(redelivery_topic(topic, GROUP), 0, 0, 10**9)]

    report = run_task(slices, config, plan(tmp_path), lambda m: len(m.value or b""))

    queue, redelivered = report.slices
    assert (queue.read, queue.succeeded, queue.next_offset) == (5_000, 5_000, 5_000)
    assert queue.pending_acks == [(0, 5_000)]  # one run for the driver, not 5,000 offsets
    assert (redelivered.read, redelivered.pending_acks) == (1, [(0, 1)])
    assert len(report.staged) == 1
    staged = pq.read_table(report.staged[0])
    assert staged.num_rows == 5_001 and set(staged["result"].to_pylist()) == {
        "1",
        "2",
        "3",
        "4",
        "5",
    }
    starts = [m for m in markers(settings, topic) if isinstance(m, StartMarker)]
    assert sum(m.count for m in starts if m.partition == 0) == 5_001  # every message started
    assert not [m for m in markers(settings, topic) if isinstance(m, EndMarker)]


def test_a_task_stops_when_the_batch_s_time_is_up_and_reports_where_to_go_on(
    config: TaskConfig, settings: KmqSettings, tmp_path: Path
) -> None:
    topic = topic_holding(settings, config, 2_000)

    def slow(_message: SparkMessage) -> None:
        time.sleep(0.002)

    report = run_task([Slice(topic, 0, 0, 10**9)], config, plan(tmp_path, seconds=1.5), slow)

    (queue,) = report.slices
    assert 0 < queue.read < 2_000  # ~1.5 s of 2 ms calls
    assert queue.next_offset == queue.read and queue.pending_acks == [(0, queue.read)]
    # a chunk cut short: its rest is read again next batch, and the tracker leaves it alone
    ends = [m for m in markers(settings, topic) if isinstance(m, EndMarker)]
    assert all(m.first_offset >= queue.read for m in ends)
    started = sum(m.count for m in markers(settings, topic) if isinstance(m, StartMarker))
    assert started - sum(m.count for m in ends) == queue.read


def test_failures_are_copied_and_acknowledged_by_the_task_successes_are_left_to_the_driver(
    config: TaskConfig, settings: KmqSettings, tmp_path: Path
) -> None:
    topic = topic_holding(settings, config, 100)

    def tens_fail(message: SparkMessage) -> int:
        if int(message.value or b"0") % 10 == 0:
            raise RuntimeError("try later")
        return 1

    report = run_task([Slice(topic, 0, 0, 10**9)], config, plan(tmp_path), tens_fail)

    (queue,) = report.slices
    assert (queue.read, queue.succeeded, queue.failed) == (100, 90, 10)
    acked_by_task = {
        m.first_offset + i
        for m in markers(settings, topic)
        if isinstance(m, EndMarker)
        for i in range(m.count)
    }
    assert acked_by_task == set(range(0, 100, 10))  # the copied failures only
    retried = read_topic(settings, f"{topic}.{GROUP}.retry.1s", 1, at_least=10)
    assert sorted(int(r.value() or b"0") for r in retried) == list(range(0, 100, 10))
    pending = {first + i for first, count in queue.pending_acks for i in range(count)}
    assert pending == set(range(100)) - acked_by_task
