"""Spark local[2] processes queue messages on its executors and acknowledges each one only after
the Parquet output is written (real broker, real Spark)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, upper

from kmq_dagster.core.headers import DLQ_REASON, header_value, normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.schemas.registry import RegistrySettings
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import COORDINATES, SparkQueueJob
from kmq_dagster.spark.processing import run_processing
from kmq_dagster.spark.session import local_session
from kmq_dagster.spark.tasks import SparkMessage
from tests.kafka_helpers import new_queue, produce, read_topic, running_service, wait_for
from tests.schema_helpers import serialized
from tests.schema_registry_double import SchemaRegistryDouble

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PARTITIONS = 2


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("kmq-tests")
    yield session
    session.stop()


@pytest.fixture
def queue(settings: KmqSettings, topic_name: str) -> OpenedQueue:
    group = f"spark-{topic_name}"  # a group per test: other tests' members would rebalance with it
    return new_queue(settings, topic_name, group, partitions=PARTITIONS, retry_delays_ms=(1_000,),
                     visibility_timeout_ms=2_000)  # fmt: skip


def shout(message: SparkMessage) -> dict[str, object]:
    """Succeeds, except for every tenth message, which is bad input."""
    number = int(message.value or b"-1")
    if number % 10 == 0:
        raise ValueError(f"{number} is not allowed")
    return {"n": number, "loud": (message.value or b"").decode() + "!"}


def test_a_batch_writes_successes_with_coordinates_dead_letters_failures_and_acks_all(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    topic_name = queue.topic
    produce(settings, topic_name, [str(i).encode() for i in range(400)], partitions=PARTITIONS)
    output = str(tmp_path / "out")
    job = SparkQueueJob(
        spark, queue.with_non_retryable(["ValueError"]), function=shout, output_path=output,
    )  # fmt: skip
    try:
        report = job.run_batch()
        again = job.run_batch()  # offsets were committed: nothing left
    finally:
        job.close()

    assert (report.read, report.succeeded, report.failed) == (400, 360, 40)
    assert again.read == 0
    rows = spark.read.parquet(output).collect()
    assert len(rows) == 360
    assert {(r["topic"], r["partition"]) for r in rows} == {(topic_name, 0), (topic_name, 1)}
    assert len({(r["partition"], r["offset"]) for r in rows}) == 360
    assert '"loud": "7!"' in next(r["result"] for r in rows if r["key"] == b"7")
    dead = read_topic(settings, queue.queue.dlq_topic, PARTITIONS, at_least=40)
    assert sorted(int(r.value() or b"-1") for r in dead) == list(range(0, 400, 10))
    # every message was acknowledged: past the 2 s visibility timeout, nothing is redelivered
    with running_service(RedeliveryTracker(queue)) as tracker:
        assert wait_for(
            lambda: tracker.caught_up_partitions() == [0, 1] and tracker.inflight_count() == 0
        )
        assert tracker.stats.markers > 0  # it read the job's markers: every start has its end
    assert tracker.stats.redelivered == 0
    assert read_topic(settings, queue.queue.redelivery_topic, PARTITIONS, timeout_s=3) == []


def test_two_jobs_of_one_group_never_own_the_same_partition(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    topic_name = queue.topic
    produce(settings, topic_name, [str(i).encode() for i in range(1, 300)], partitions=PARTITIONS)
    output = str(tmp_path / "out")
    # failures go to the DLQ, so nothing is read twice
    fatal = queue.with_non_retryable(["ValueError"])
    first = SparkQueueJob(spark, fatal, function=shout, output_path=output)
    second = SparkQueueJob(spark, fatal, function=shout, output_path=output)
    try:
        first.lease.join()
        second.lease.join()
        every = {
            (t, p)
            for t in queue.queue.consumed_topics
            for p in range(queue.queue.partitions_of(t) or 1)
        }
        assert wait_for(
            lambda: (
                first.lease.owned() | second.lease.owned() == every
                and not first.lease.owned() & second.lease.owned()
                and bool(first.lease.owned())
                and bool(second.lease.owned())
            ),
            timeout_s=60,
        ), (first.lease.owned(), second.lease.owned())
        reports = [first.run_batch(), second.run_batch()]
    finally:
        first.close()
        second.close()

    rows = spark.read.parquet(output).collect()
    assert sum(r.read for r in reports) == 299  # between them, each message once
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows)


def test_a_dataframe_transform_is_written_and_its_messages_acknowledged(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    produce(settings, queue.topic, [f"order-{i}".encode() for i in range(300)],
            partitions=PARTITIONS)  # fmt: skip
    output = str(tmp_path / "out")

    def loud(frame: DataFrame) -> DataFrame:
        return frame.select("topic", "partition", "offset", upper(col("value").cast("string")))

    job = SparkQueueJob(spark, queue, transform=loud, output_path=output)
    try:
        totals = run_processing(job, None)
    finally:
        job.close()

    rows = spark.read.parquet(output).collect()
    assert (totals.batches, totals.read, len(rows)) == (2, 300, 300)  # the second read nothing
    assert {r[3] for r in rows} == {f"ORDER-{i}" for i in range(300)}
    with running_service(RedeliveryTracker(queue)) as tracker:
        assert wait_for(
            lambda: tracker.caught_up_partitions() == [0, 1] and tracker.inflight_count() == 0
        )
        assert tracker.stats.markers > 0  # it read the job's markers: every start has its end
    assert tracker.stats.redelivered == 0


def test_a_transform_must_keep_the_coordinates_and_a_failed_one_commits_nothing(
    spark: SparkSession, settings: KmqSettings, queue: OpenedQueue, tmp_path: Path
) -> None:
    produce(settings, queue.topic, [b"x"], partitions=PARTITIONS)
    output = str(tmp_path / "out")
    job = SparkQueueJob(
        spark, queue, transform=lambda frame: frame.select("value"), output_path=output
    )
    try:
        with pytest.raises(ConfigError, match="lacks topic, partition, offset"):
            job.run_batch()
    finally:
        job.close()

    fixed = SparkQueueJob(
        spark, queue, transform=lambda f: f.select(*COORDINATES, "value"),
        output_path=output,
    )  # fmt: skip
    try:
        report = fixed.run_batch()
    finally:
        fixed.close()
    assert report.read == 1  # its offset was not committed: read again
    assert [r["value"] for r in spark.read.parquet(output).collect()] == [b"x"]


def order_row(message: SparkMessage) -> dict[str, object]:
    order = message.decoded()
    return {"id": order["id"], "customer": order["customer"]}


def test_a_spark_function_decodes_avro_values_through_the_registry_with_its_credentials(
    spark: SparkSession, settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    """The executors ask the registry (the REST test double, basic auth) themselves: the
    registry settings travel with the queue; an undecodable value is dead-lettered as is."""
    user_info = "spark-test:s3cret-pw"
    with SchemaRegistryDouble(user_info) as double:
        registry = RegistrySettings(double.url, {"basic.auth.user.info": user_info})
        producer_side = SchemaRegistryClient({"url": double.url, "basic.auth.user.info": user_info})
        orders = [{"id": i, "customer": f"c{i}"} for i in range(6)]
        values = [serialized("avro", producer_side, topic_name, order) for order in orders]
        garbage = b"not avro at all"
        queue = Queue(topic_name, f"spark-{topic_name}", partitions=PARTITIONS,
                      retry_policy=RetryPolicy.fixed((1_000,)),
                      value_format=ValueFormat.AVRO)  # fmt: skip
        opened = provision_queue(settings.with_overrides(schema_registry=registry), queue).opened
        produce(settings, topic_name, [*values, garbage], partitions=PARTITIONS)
        output = str(tmp_path / "orders")
        job = SparkQueueJob(spark, opened, function=order_row, output_path=output)
        counts = [0, 0, 0]  # read, succeeded, failed; a batch may stop early on a busy machine
        try:
            for _ in range(5):
                report = job.run_batch()
                counts = [counts[0] + report.read, counts[1] + report.succeeded,
                          counts[2] + report.failed]  # fmt: skip
                if counts[0] >= 7 or report.read == 0:
                    break
        finally:
            job.close()
        asked_by_id = double.asked("GET", "/schemas/ids/1")

    assert counts == [7, 6, 1]
    rows = spark.read.parquet(output).collect()
    assert sorted((json.loads(r["result"]) for r in rows), key=lambda o: o["id"]) == orders
    assert asked_by_id and double.unauthorized == 0
    dead = read_topic(settings, opened.queue.dlq_topic, PARTITIONS, at_least=1)
    assert [r.value() for r in dead] == [garbage]
    reason = header_value(normalize_headers(dead[0].headers()), DLQ_REASON) or b""
    assert reason.startswith(b"undecodable value: not in the Schema Registry wire format")
