"""The same function over the same messages on Spark without kmq: what reliability costs.

The messages are dumped from Kafka to Parquet first (not timed). The timed job reads the dump
in Spark tasks, runs the function with the very code kmq's tasks use per chunk (messages built
from columns, the function called, results as JSON) and writes the same output columns through
the same sink (files staged by the tasks, committed by the driver): kmq minus Kafka, markers,
acknowledgements and offsets. Two variants are reported beside it: the same job reading the
topic from Kafka instead of the dump (kmq minus markers, acknowledgements and offsets), and the
DataFrame job one would write first (``mapInArrow``, Spark's own Parquet writer).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from kmq_dagster.kafka.clients import CLIENT_LOGGER
from kmq_dagster.kafka.record_columns import RecordColumns, record_columns
from kmq_dagster.kafka.slice_reader import CHUNK_SIZE, Slice, SliceReader
from kmq_dagster.kafka.topic_reader import records_and_ends
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import OUTPUT_SCHEMA
from kmq_dagster.spark.message import spark_messages
from kmq_dagster.spark.process import Function, Outcome, call_function, output_columns
from kmq_dagster.spark.sink import OUTPUT_COLUMNS, ParquetSink, StagedFile

#: Columns of the dump: the messages as read from Kafka.
DUMP_COLUMNS = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp_ms", pa.int64()),
        ("headers", pa.list_(pa.struct([("name", pa.string()), ("value", pa.binary())]))),
    ]
)
#: Records written to the dump at a time.
DUMP_BATCH = 50_000


def dump_topic(settings: KmqSettings, topic: str, partitions: int, directory: Path) -> int:
    """Write every message of ``topic`` to one Parquet file per partition; returns the count."""
    consumer = Consumer(
        settings.consumer_config(
            f"kmq-bench-dump-{uuid.uuid4().hex}",
            **{"enable.partition.eof": True, "logger": CLIENT_LOGGER},
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    directory.mkdir(parents=True, exist_ok=True)
    writers = {
        p: pq.ParquetWriter(str(directory / f"partition-{p}.parquet"), DUMP_COLUMNS)
        for p in range(partitions)
    }
    at_end: set[int] = set()
    total = 0
    try:
        while len(at_end) < partitions:
            records = records_and_ends(consumer.consume(DUMP_BATCH, 1.0), at_end)
            for partition, writer in writers.items():
                mine = [r for r in records if r.partition() == partition]
                if mine:
                    writer.write_batch(_dump_batch(topic, partition, record_columns(mine)))
            total += len(records)
    finally:
        consumer.close()
        for writer in writers.values():
            writer.close()
    return total


def _dump_batch(topic: str, partition: int, columns: RecordColumns) -> pa.RecordBatch:
    count = len(columns.offsets)
    headers = [
        [{"name": n, "value": v} for n, v in raw] if raw else None for raw in columns.raw_headers
    ]
    arrays = [[topic] * count, [partition] * count, *columns[:4], headers]
    return pa.record_batch(
        [pa.array(a, f.type) for a, f in zip(arrays, DUMP_COLUMNS, strict=True)],
        schema=DUMP_COLUMNS,
    )


def plain_spark_seconds(spark: SparkSession, function: Function, dump: Path, output: Path) -> float:
    """Seconds for Spark tasks to read the dump, run ``function`` per message and write the
    output through the sink kmq writes through (staged files, committed by the driver)."""
    batch_id = uuid.uuid4().hex[:12]
    sink = ParquetSink(str(output))
    files = sorted(str(path) for path in dump.glob("*.parquet"))

    def run(path: str) -> str | None:
        rows = StagedFile(sink, batch_id, OUTPUT_COLUMNS)
        for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK_SIZE):
            rows.append(_apply(function, batch, batch_id))
        rows.close()
        return rows.path

    started = time.perf_counter()
    staged = spark.sparkContext.parallelize(files, len(files)).map(run).collect()
    sink.commit([path for path in staged if path is not None])
    sink.discard(batch_id)
    return time.perf_counter() - started


def kafka_spark_seconds(
    spark: SparkSession,
    function: Function,
    settings: KmqSettings,
    topic: str,
    *,
    partitions: int,
    output: Path,
) -> float:
    """The same without the dump: Spark tasks read the topic from Kafka as kmq's tasks do (one
    consumer, chunks of 500), run ``function`` and write through the same sink, but write no
    markers, acknowledge nothing and commit no offsets. kmq against this is the price of
    per-message reliability alone."""
    batch_id = uuid.uuid4().hex[:12]
    sink = ParquetSink(str(output))

    def run(partition: int) -> str | None:
        reader = SliceReader(settings, [Slice(topic, partition, 0, 2**62)], float("inf"))
        rows = StagedFile(sink, batch_id, OUTPUT_COLUMNS)
        try:
            for work, records in reader.chunks():
                columns = record_columns(records)
                messages = spark_messages(work.topic, work.partition, columns)
                outcome = call_function(function, messages, stop_at=float("inf"))
                rows.append(output_columns(messages, outcome, columns, batch_id))
        finally:
            reader.close()
        rows.close()
        return rows.path

    started = time.perf_counter()
    staged = spark.sparkContext.parallelize(range(partitions), partitions).map(run).collect()
    sink.commit([path for path in staged if path is not None])
    sink.discard(batch_id)
    return time.perf_counter() - started


def dataframe_spark_seconds(
    spark: SparkSession, function: Function, dump: Path, output: Path
) -> float:
    """The same as a DataFrame job: the function over Arrow batches (``mapInArrow``), the
    output written by Spark's own Parquet writer."""
    batch_id = uuid.uuid4().hex[:12]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = _apply(function, batch, batch_id)
            yield pa.record_batch(
                [pa.array(list(c), f.type) for c, f in zip(columns, OUTPUT_COLUMNS, strict=True)],
                schema=OUTPUT_COLUMNS,
            )

    started = time.perf_counter()
    frame = spark.read.parquet(str(dump))
    frame.mapInArrow(run, OUTPUT_SCHEMA).write.mode("append").parquet(str(output))
    return time.perf_counter() - started


def _apply(function: Function, batch: pa.RecordBatch, batch_id: str) -> list[Any]:
    """What kmq's tasks do per chunk, minus the queue: messages, calls, output columns."""
    columns = RecordColumns(
        batch.column("offset").to_pylist(),
        batch.column("key").to_pylist(),
        batch.column("value").to_pylist(),
        batch.column("timestamp_ms").to_pylist(),
        [
            [(h["name"], h["value"]) for h in headers] if headers else None
            for headers in batch.column("headers").to_pylist()
        ],
    )
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    messages = spark_messages(topics, partitions, columns)
    outcome: Outcome = call_function(function, messages, stop_at=float("inf"))
    rows = output_columns(messages, outcome, columns, batch_id)
    mixed = topics.count(topics[0]) < len(topics) or partitions.count(partitions[0]) < len(topics)
    if mixed and not any(columns.raw_headers):
        # A batch may span two dump files. Without headers each message's origin is where it
        # was read, which output_columns takes from the first message for the whole chunk.
        kept = outcome.succeeded()
        rows[0] = [t for t, ok in zip(topics, kept, strict=True) if ok]
        rows[1] = [p for p, ok in zip(partitions, kept, strict=True) if ok]
    return rows
