"""What Spark tasks run on the executors: read one queue partition's slice with confluent-kafka,
write its start markers, process each message, route failures, acknowledge.

Everything here is shipped to executors by pickling: plain data in, plain rows out; payloads
stay on the executors (and in the sink), never on the driver.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.due import split_due
from kmq_dagster.core.markers import EndMarker, StartMarker, encode_marker
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.ranges import offset_runs
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.message import due_ms_or_now, offset_of, origin_coordinates
from kmq_dagster.settings import KmqSettings

#: Longest a task waits for its slice's messages before taking what it has.
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Slice:
    """Up to ``max_messages`` messages of one partition, from ``start_offset``."""

    topic: str
    partition: int
    start_offset: int
    max_messages: int
    #: Retry topics hold messages with due times: a slice stops at the first one not due.
    gated: bool = False


@dataclass(frozen=True)
class TaskConfig:
    """What every task of a job needs: where Kafka is, the queue, the retry policy in use."""

    settings: KmqSettings
    queue: Queue
    policy: RetryPolicy

    @property
    def visibility_timeout_ms(self) -> int:
        return self.queue.visibility_timeout_ms


@dataclass(frozen=True)
class SparkMessage:
    """One queue message, as the user's function gets it on an executor."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_ms: int = 0


Function = Callable[[SparkMessage], object]

#: Rows a task returns: ("ok", origin topic, partition, offset, key, result JSON) per success,
#: ("done", topic, partition, next offset, None, JSON summary) per slice; the summary has the
#: succeeded offsets' runs (acknowledged after the sink write) and counts.
Row = tuple[str, str, int, int, bytes | None, str]


def run_slice(work: Slice, config: TaskConfig, function: Function) -> Iterator[Row]:
    """Process one slice; yields a row per success and one ``done`` row.

    Failed messages are copied to the retry topic or DLQ and acknowledged here. Successes are
    acknowledged later, by :func:`acknowledge`, once the sink write has committed.
    """
    from kmq_dagster.kafka.retry_router import RetryRouter, failure_of

    messages = _start(work, config)
    if not messages:
        yield ("done", work.topic, work.partition, work.start_offset, None, _summary([], 0, 0))
        return
    succeeded: list[int] = []
    failed: list[tuple[SparkMessage, Failure | str]] = []
    router = RetryRouter(
        config.settings, config.queue, policy=config.policy, clock_ms=wall_clock_ms
    )
    for message in messages:
        problem = router.metadata_problem(message)
        if problem is not None:
            failed.append((message, problem))
            continue
        try:
            result = function(message)
        except Exception as exc:
            failed.append((message, failure_of(exc)))
            continue
        succeeded.append(message.offset)
        origin = origin_coordinates(message)
        yield ("ok", origin[0], origin[1], origin[2], message.key, _as_json(result))
    routed = router.route(failed) if failed else []
    router.close()
    _write_end_markers(config, work.topic, work.partition, [m.offset for m in routed])
    next_offset = messages[-1].offset + 1
    summary = _summary(succeeded, len(messages), len(failed))
    yield ("done", work.topic, work.partition, next_offset, None, summary)


#: A message row for DataFrame transforms: ("msg", origin topic, partition, offset, key,
#: value, timestamp ms, headers as [name, value] pairs).
MessageRow = tuple[
    str, str, int, int, bytes | None, bytes | None, int, list[tuple[str, bytes | None]]
]


def read_slice(work: Slice, config: TaskConfig) -> Iterator[MessageRow | Row]:
    """For DataFrame transforms: read one slice, write its start markers, yield one row per
    message and one ``done`` row; nothing is acknowledged until the batch's output is written."""
    messages = _start(work, config)
    if not messages:
        yield ("done", work.topic, work.partition, work.start_offset, None, _summary([], 0, 0))
        return
    for message in messages:
        origin = origin_coordinates(message)
        yield ("msg", *origin, message.key, message.value, message.timestamp_ms, message.headers)
    offsets = [m.offset for m in messages]
    summary = _summary(offsets, len(messages), 0)
    yield ("done", work.topic, work.partition, offsets[-1] + 1, None, summary)


def acknowledge(done_rows: Iterable[Row], config: TaskConfig) -> None:
    """Write the end markers of the successes that ``done`` rows list (after the sink write)."""
    for _kind, topic, partition, _next, _key, summary in done_rows:
        runs = json.loads(summary)["runs"]
        offsets = [first + i for first, count in runs for i in range(count)]
        _write_end_markers(config, topic, partition, offsets)


def _start(work: Slice, config: TaskConfig) -> list[SparkMessage]:
    """Read the slice (up to its first message not due, on a retry topic) and write its start
    markers; returns the messages now in flight."""
    messages = _read(work, config.settings)
    if work.gated:
        messages = split_due(messages, wall_clock_ms(), due_ms_or_now, offset_of).ready
    if messages:
        _write_start_markers(work, messages, config)
    return messages


def _summary(succeeded: list[int], read: int, failed: int) -> str:
    runs = offset_runs(succeeded) if succeeded else []
    return json.dumps({"runs": runs, "read": read, "succeeded": len(succeeded), "failed": failed})


def _read(work: Slice, settings: KmqSettings) -> list[SparkMessage]:
    from confluent_kafka import Consumer, TopicPartition

    from kmq_dagster.core.headers import normalize_headers
    from kmq_dagster.kafka.topic_reader import records_and_ends

    consumer = Consumer(
        settings.consumer_config(
            f"kmq-spark-reader-{uuid.uuid4().hex}", **{"enable.partition.eof": True}
        )
    )
    consumer.assign([TopicPartition(work.topic, work.partition, work.start_offset)])
    messages: list[SparkMessage] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while len(messages) < work.max_messages and time.monotonic() < deadline:
            fetched = consumer.consume(min(500, work.max_messages - len(messages)), 1.0)
            messages += (
                SparkMessage(
                    work.topic,
                    work.partition,
                    record.offset() or 0,
                    record.key(),
                    record.value(),
                    normalize_headers(record.headers()),
                    record.timestamp()[1],
                )
                for record in records_and_ends(fetched, at_end)
            )
            if at_end:
                break
    finally:
        consumer.close()
    return messages[: work.max_messages]


def _write_start_markers(work: Slice, messages: list[SparkMessage], config: TaskConfig) -> None:
    """Durable before any processing (and before the driver commits the slice's offsets)."""
    deadline_ms = wall_clock_ms() + config.visibility_timeout_ms
    starts = [
        StartMarker(work.topic, work.partition, first, count, deadline_ms)
        for first, count in offset_runs([m.offset for m in messages])
    ]
    _produce_markers(config, starts)


def _write_end_markers(config: TaskConfig, topic: str, partition: int, offsets: list[int]) -> None:
    if offsets:
        ends = [EndMarker(topic, partition, f, c) for f, c in offset_runs(sorted(offsets))]
        _produce_markers(config, ends)


#: One marker producer per executor process and cluster: Spark reuses its Python workers, and
#: an idempotent producer spends ~0.5 s getting its producer id (measured on the embedded broker).
_PRODUCERS: dict[str, Any] = {}


def _marker_producer(settings: KmqSettings) -> Any:
    from confluent_kafka import Producer

    config = settings.producer_config()
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _PRODUCERS:
        _PRODUCERS[key] = Producer(config)
    return _PRODUCERS[key]


def _produce_markers(config: TaskConfig, markers: list[StartMarker] | list[EndMarker]) -> None:
    from confluent_kafka import KafkaError, KafkaException, Message

    producer = _marker_producer(config.settings)
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, _record: Message) -> None:
        if error is not None:
            errors.append(error)

    topic = config.queue.markers_topic
    for marker in markers:
        producer.produce(
            topic, value=encode_marker(marker), partition=marker.partition, on_delivery=delivered
        )
    remaining = producer.flush(30)
    if errors or remaining:
        # Spark retries the task: markers are idempotent facts, writing them twice is harmless.
        raise KafkaException(errors[0] if errors else KafkaError(KafkaError._TIMED_OUT))


def _as_json(result: object) -> str:
    if isinstance(result, bytes):
        result = result.decode("utf-8", errors="replace")
    try:
        return json.dumps(result)
    except TypeError:
        return json.dumps(str(result))
