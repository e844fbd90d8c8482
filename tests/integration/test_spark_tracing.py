"""OpenTelemetry traces through Spark at concurrency: each call of a job's function, on the
executors, is a ``process`` span in the trace of the message's send, current while the function
runs, with the worker's attributes; a failed call's retry copy is its child (real broker, Spark
local[2]; the executors trace into a file, see tests.support.spark_tracing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pyspark.sql import SparkSession

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.job import SparkQueueJob
from kmq_dagster.tracing import ORDERING_WAIT_MS
from tests.integration import test_spark_processing
from tests.kafka_helpers import new_queue
from tests.support.spark_concurrency import read_lines
from tests.support.spark_tracing import BAD, TracedAsyncEcho, TracedSyncEcho, read_spans

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: The Spark session test_spark_processing starts, shared rather than started again.
spark = test_spark_processing.spark

VALUES = [b"m0", b"m1", BAD, b"m3", b"m4", b"m5"]
#: How long each call's I/O takes: long enough for calls to queue for a slot.
WAIT_S = 0.05


@pytest.mark.parametrize(
    ("function_type", "concurrency", "ordering"),
    [(TracedAsyncEcho, 3, Ordering.UNORDERED), (TracedSyncEcho, 2, Ordering.KEY)],
    ids=["async", "threads"],
)
def test_each_spark_call_at_concurrency_is_a_process_span_of_its_message_trace(
    spark: SparkSession,
    settings: KmqSettings,
    topic_name: str,
    tmp_path: Path,
    exporter: InMemorySpanExporter,
    function_type: type[TracedAsyncEcho | TracedSyncEcho],
    concurrency: int,
    ordering: Ordering,
) -> None:
    # given six messages sent with tracing on one partition (offsets in send order), one bad
    group = f"spark-{topic_name}"
    queue = new_queue(settings, topic_name, group, retry_delays_ms=(1_000,))
    producer = KmqProducer(settings)
    for index, value in enumerate(VALUES):
        producer.send(queue.topic, value, key=f"k{index}")
    assert producer.flush() == 0
    sends = sorted(
        (s for s in exporter.get_finished_spans() if s.name == f"send {queue.topic}"),
        key=lambda span: span.start_time or 0,
    )

    # when a Spark batch calls a function several at once on them
    calls = tmp_path / "calls.txt"
    job = SparkQueueJob(spark, queue, output_path=str(tmp_path / "out"),
                        function=function_type(str(calls), WAIT_S), concurrency=concurrency,
                        ordering=ordering)  # fmt: skip
    try:
        report = job.run_batch()
    finally:
        job.close()
    assert (report.read, report.succeeded, report.failed) == (6, 5, 1)

    # then each call is a process span, the child of its message's send, in its trace
    spans = read_spans(calls)
    processed = {
        span["attributes"]["messaging.kafka.offset"]: span
        for span in spans
        if span["name"] == f"process {queue.topic}"
    }
    assert sorted(processed) == list(range(len(VALUES)))
    for offset, send in enumerate(sends):
        assert send.context is not None
        span = processed[offset]
        assert (span["trace_id"], span["parent_id"]) == (send.context.trace_id,
                                                        send.context.span_id)  # fmt: skip
        assert span["attributes"]["messaging.consumer.group.name"] == group
        assert span["attributes"]["messaging.destination.partition.id"] == "0"
        assert span["attributes"]["kmq.attempt"] == 1
    # and it is current while the function runs, on the event loop or a pool thread
    current = {int(words[1]): int(words[2]) for words in read_lines(calls)}
    assert current == {offset: span["span_id"] for offset, span in processed.items()}
    # and says how long its message waited for a free call: the later ones for earlier calls
    waits = [processed[offset]["attributes"][ORDERING_WAIT_MS] for offset in range(len(VALUES))]
    assert waits[0] < WAIT_S * 1000 / 2 <= waits[-1], waits
    # and the failed call says why, and its retry copy is its child
    bad = processed[VALUES.index(BAD)]
    assert (bad["status"], bad["attributes"]["error.type"]) == ("ERROR", "ValueError")
    (retry,) = [s for s in spans if s["name"] == f"retry {queue.queue.retry_topics[1_000]}"]
    assert (retry["trace_id"], retry["parent_id"]) == (bad["trace_id"], bad["span_id"])
