"""A Spark job with ``concurrency`` calls its function on many messages of a chunk at once,
within the limit and the ordering, and every message still ends in the sink once (real
broker, Spark local[2])."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.spark.processing import ProcessingReport, run_processing
from tests.integration import test_spark_processing
from tests.kafka_helpers import LONGEST_WAIT_S, new_queue, read_topic, running_service, wait_for
from tests.processes import run_kmq
from tests.support.spark_concurrency import (
    AwaitingEcho,
    KeyOverlapChecker,
    awaiting_picky,
    deferred_upper,
    read_lines,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PARTITIONS = 2

#: The Spark session test_spark_processing starts, shared rather than started again.
spark = test_spark_processing.spark


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    return new_queue(settings, topic_name, f"spark-{topic_name}", partitions=PARTITIONS,
                     retry_delays_ms=(1_000,), visibility_timeout_ms=30_000)  # fmt: skip


def produce_keyed(settings: KmqSettings, topic: str, keys: list[str]) -> None:
    """One message per key given, its value its index; a key always goes to one partition."""
    producer = Producer(settings.producer_config())
    for index, key in enumerate(keys):
        partition = sum(key.encode()) % PARTITIONS
        producer.produce(topic, key=key.encode(), value=f"m{index}".encode(), partition=partition)
    assert producer.flush(30) == 0


def process(
    spark: SparkSession, queue: OpenedQueue, output: str, **job: object
) -> ProcessingReport:
    spark_job = SparkQueueJob(spark, queue, output_path=output, **job)  # type: ignore[arg-type]
    try:
        return run_processing(spark_job, None)
    finally:
        spark_job.close()


def test_an_async_function_at_concurrency_20_handles_every_message_once_20_at_a_time_at_most(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    # given 200 messages and a function that awaits 50 ms of I/O per message
    produce_keyed(settings, queue.topic, [f"k{i}" for i in range(200)])
    record = tmp_path / "calls.txt"
    output = str(tmp_path / "out")

    # when they are processed with up to 20 calls at once per task
    report = process(spark, queue, output, function=AwaitingEcho(str(record)), concurrency=20,
                     ordering=Ordering.UNORDERED)  # fmt: skip

    # then the sink holds each message once, with the awaited result
    rows = spark.read.parquet(output).collect()
    assert report.succeeded == report.read == 200
    assert sorted(r["result"] for r in rows) == sorted(f'"M{i}"' for i in range(200))  # JSON text
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows) == 200
    # and calls overlapped within a task, never more than 20 of them
    peaks = [int(words[1]) for words in read_lines(record) if words[0] == "peak"]
    assert 1 < max(peaks) <= 20


def test_in_key_order_no_two_calls_of_a_key_overlap_and_a_key_starts_in_offset_order(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    # given six keys (three per partition), 50 messages each, interleaved
    keys = [f"key-{i % 6}" for i in range(300)]
    produce_keyed(settings, queue.topic, keys)
    record = tmp_path / "calls.txt"
    output = str(tmp_path / "out")

    # when a sync function waiting 2 ms per call runs in key order with room for eight calls
    report = process(spark, queue, output, function=KeyOverlapChecker(str(record)),
                     concurrency=8, ordering="key")  # fmt: skip

    # then every message was handled, different keys ran together, one key never twice at once
    lines = read_lines(record)
    assert report.succeeded == report.read == 300
    assert len(spark.read.parquet(output).collect()) == 300
    assert [words for words in lines if words[0] == "overlap"] == []
    assert 1 < max(int(words[1]) for words in lines if words[0] == "peak") <= 3
    # and each key's messages started in offset order
    starts: dict[str, list[int]] = {}
    for words in lines:
        if words[0] == "start":
            starts.setdefault(words[1], []).append(int(words[2]))
    assert len(starts) == 6
    assert all(offsets == sorted(offsets) and len(offsets) == 50 for offsets in starts.values())


def test_failures_at_concurrency_go_to_the_dlq_one_by_one_and_everything_else_is_acknowledged(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    # given 300 messages of which every tenth fails, processed 16 at a time in key order
    produce_keyed(settings, queue.topic, [f"k{i % 7}" for i in range(300)])
    output = str(tmp_path / "out")
    job = SparkQueueJob(spark, queue.with_non_retryable(["ValueError"]), output_path=output,
                        function=awaiting_picky, concurrency=16, ordering="key")  # fmt: skip
    try:
        report = job.run_batch()
    finally:
        job.close()

    # then the failures, and only they, are in the DLQ; the rest in the sink, once each
    assert (report.read, report.succeeded, report.failed) == (300, 270, 30)
    dead = read_topic(settings, queue.queue.dlq_topic, PARTITIONS, at_least=30)
    assert sorted(int((r.value() or b"m-1")[1:]) for r in dead) == list(range(0, 300, 10))
    rows = spark.read.parquet(output).collect()
    assert sorted(int(r["result"].strip('"')) for r in rows) == [i for i in range(300) if i % 10]
    # and every message was acknowledged: none is redelivered
    with running_service(RedeliveryTracker(queue)) as tracker:
        assert wait_for(
            lambda: tracker.caught_up_partitions() == [0, 1] and tracker.inflight_count() == 0
        )
    assert tracker.stats.redelivered == 0


def test_at_concurrency_1_a_returned_coroutine_is_awaited_and_a_returned_generator_dead_lettered(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    # given 20 messages and a plain function that returns a coroutine, or a generator for the
    # two values ending in 7: neither has done its work when the function returns
    produce_keyed(settings, queue.topic, [f"k{i}" for i in range(20)])
    output = str(tmp_path / "out")

    # when a batch runs it at the default concurrency 1 (the sequential loop)
    job = SparkQueueJob(spark, queue, output_path=output, function=deferred_upper)
    try:
        report = job.run_batch()
    finally:
        job.close()

    # then each coroutine was awaited: its result is in the sink, not the coroutine's text
    assert (report.read, report.succeeded, report.failed) == (20, 18, 2)
    rows = spark.read.parquet(output).collect()
    assert sorted(r["result"] for r in rows) == sorted(
        f'"M{i}"' for i in range(20) if i not in (7, 17)
    )
    # and each generator's message is dead-lettered with the reason, never written as done
    dead = read_topic(settings, queue.queue.dlq_topic, PARTITIONS, at_least=2)
    assert sorted((r.value() or b"").decode() for r in dead) == ["m17", "m7"]
    reasons = {dict(r.headers() or []).get("kmq-error-type") for r in dead}
    assert reasons == {b"HandlerResultError"}


def test_kmq_spark_passes_concurrency_and_ordering_to_the_tasks(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    produce_keyed(settings, queue.topic, [f"k{i}" for i in range(100)])
    record = tmp_path / "calls.txt"
    output = tmp_path / "out"

    done = run_kmq(
        "spark", "--topic", queue.topic, "--group", queue.group, "--output", str(output),
        "--function", "tests.support.spark_concurrency:awaiting_upper",
        "--concurrency", "10", "--ordering", "unordered",
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_SESSION_TIMEOUT_MS": "6000",
             "KMQ_TEST_CALLS_FILE": str(record)},
        timeout_s=LONGEST_WAIT_S,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "read 100, succeeded 100, failed 0" in done.stdout
    rows = spark.read.parquet(str(output)).collect()
    assert sorted(r["result"] for r in rows) == sorted(f'"M{i}"' for i in range(100))
    peaks = [int(words[1]) for words in read_lines(record) if words[0] == "peak"]
    assert 1 < max(peaks) <= 10
