"""OpenTelemetry traces through the real broker: one trace follows a message from its send
through failures, a retry, the DLQ and a replay to its success, and a redelivery by the
tracker; with tracing off, nothing of OpenTelemetry is imported and no header is written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kmq_dagster.core.delay import DELAY_LEVELS_MS
from kmq_dagster.core.headers import Headers, header_value, normalize_headers
from kmq_dagster.core.naming import delay_topic
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.delay_forwarder import DelayForwarder
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import ORDERING_WAIT_MS
from kmq_dagster.worker.worker import Worker
from tests.kafka_helpers import (
    new_queue,
    poll_until,
    read_topic,
    running_service,
    running_worker,
    wait_for,
)

pytestmark = pytest.mark.kafka

DELAY_MS = 1_000
#: How long a handler's work takes, where the test needs calls to overlap.
WORK_S = 0.1
REPO_ROOT = Path(__file__).resolve().parents[2]


def finished(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def linked_ids(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


def test_one_trace_follows_a_message_through_retry_dead_letter_and_replay_to_success(
    settings: KmqSettings, topic_name: str, exporter: InMemorySpanExporter
) -> None:
    # given a queue with one retry, and a handler that fails twice, then succeeds
    queue = new_queue(settings, topic_name, retry_delays_ms=(DELAY_MS,))
    retry_topic = queue.queue.retry_topics[DELAY_MS]
    dlq, redelivery = queue.queue.dlq_topic, queue.queue.redelivery_topic
    calls: list[KmqMessage] = []

    def handler(message: KmqMessage) -> None:
        calls.append(message)
        if len(calls) <= 2:
            raise TimeoutError("the billing service is down")

    # when a message is sent inside the application's span, fails until dead-lettered, and
    # is replayed
    producer = KmqProducer(settings)
    with trace.get_tracer("shop", tracer_provider=_provider_of(exporter)).start_as_current_span(
        "checkout"
    ) as checkout:
        producer.send(queue.topic, b"order-1", key=b"1")
    assert producer.flush() == 0
    with running_worker(queue, handler):
        assert wait_for(lambda: finished(exporter, f"dead-letter {dlq}"), 30), "no dead letter"
        assert replay_dead_letters(queue, ReplayRequest()).replayed == 1
        assert wait_for(lambda: finished(exporter, f"process {redelivery}"), 30), "no replay"

    # then every span is in the checkout's trace, one hop after the other
    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    trace_id = checkout.get_span_context().trace_id
    assert {span.context.trace_id for span in spans if span.context} == {trace_id}
    assert [(span.name, span.kind) for span in spans] == [
        ("checkout", SpanKind.INTERNAL),
        (f"send {queue.topic}", SpanKind.PRODUCER),
        (f"process {queue.topic}", SpanKind.CONSUMER),
        (f"retry {retry_topic}", SpanKind.PRODUCER),
        (f"process {retry_topic}", SpanKind.CONSUMER),
        (f"dead-letter {dlq}", SpanKind.PRODUCER),
        (f"replay {redelivery}", SpanKind.PRODUCER),
        (f"process {redelivery}", SpanKind.CONSUMER),
    ]
    # each hop is the child of the one before it: a copy of the failed call that made it
    assert [parent_id(span) for span in spans[1:]] == [span_id(span) for span in spans[:-1]]
    # and every span but the send links to the span whose context its record carried
    send, first, retry, second, dead, replay, success = spans[1:]
    assert linked_ids(first) == [span_id(send)]
    assert linked_ids(retry) == [span_id(send)]  # the record it copies came from the send
    assert linked_ids(second) == [span_id(retry)]
    assert linked_ids(dead) == [span_id(retry)]
    assert linked_ids(replay) == [span_id(dead)]
    assert linked_ids(success) == [span_id(replay)]

    # and the spans say where, which attempt, and what went wrong, by messaging conventions
    for span, topic, attempt in ((first, queue.topic, 1), (second, retry_topic, 2)):
        attributes = dict(span.attributes or {})
        assert attributes["messaging.system"] == "kafka"
        assert attributes["messaging.destination.name"] == topic
        assert attributes["messaging.destination.partition.id"] == "0"
        assert attributes["messaging.kafka.offset"] == 0
        assert attributes["messaging.consumer.group.name"] == queue.group
        assert attributes["kmq.attempt"] == attempt
        assert attributes["error.type"] == "TimeoutError"
        assert span.status.status_code is StatusCode.ERROR
        assert not span.events  # error text is data: no exception event with its message
    assert dict(retry.attributes or {})["kmq.attempt"] == 2
    assert dict(dead.attributes or {})["error.type"] == "TimeoutError"
    assert dict(replay.attributes or {})["messaging.consumer.group.name"] == queue.group
    assert "error.type" not in dict(success.attributes or {})
    assert success.status.status_code is StatusCode.UNSET
    assert [m.value for m in calls] == [b"order-1"] * 3


def test_a_redelivery_by_the_tracker_continues_the_message_trace(
    settings: KmqSettings, topic_name: str, exporter: InMemorySpanExporter
) -> None:
    # given a message sent with tracing, taken by a consumer that never acknowledges it
    queue = new_queue(settings, topic_name, visibility_timeout_ms=1_000)
    producer = KmqProducer(settings)
    producer.send(queue.topic, b"order-2")
    assert producer.flush() == 0
    lost = KmqConsumer(queue)
    try:
        assert len(poll_until(lost, 1)) == 1
    finally:
        lost.close()

    # when the tracker redelivers it and a worker processes the copy
    seen: list[KmqMessage] = []
    with running_service(RedeliveryTracker(queue)), running_worker(queue, seen.append):
        assert wait_for(
            lambda: finished(exporter, f"process {queue.queue.redelivery_topic}"), timeout_s=60
        )

    # then the redelivery is a hop of the message's trace between its send and its processing
    (send,) = finished(exporter, f"send {queue.topic}")
    (redeliver,) = finished(exporter, f"redeliver {queue.queue.redelivery_topic}")
    (processed,) = finished(exporter, f"process {queue.queue.redelivery_topic}")
    assert parent_id(redeliver) == span_id(send) and linked_ids(redeliver) == [span_id(send)]
    assert parent_id(processed) == span_id(redeliver)
    assert dict(processed.attributes or {})["kmq.redelivery_count"] == 1
    assert dict(redeliver.attributes or {})["kmq.source.offset"] == 0


@pytest.mark.parametrize(
    ("concurrency", "is_async"),
    [(1, False), (2, False), (2, True)],
    ids=["serial", "threads", "async"],
)
def test_the_handler_runs_inside_its_process_span_at_every_concurrency(
    settings: KmqSettings,
    topic_name: str,
    exporter: InMemorySpanExporter,
    concurrency: int,
    is_async: bool,
) -> None:
    # given a handler that fails its first call and notes the span current in each call
    queue = new_queue(settings, topic_name, retry_delays_ms=(DELAY_MS,))
    current: list[int] = []

    def note_and_fail_once() -> None:
        current.append(trace.get_current_span().get_span_context().span_id)
        if len(current) == 1:
            raise TimeoutError("once")

    async def async_handler(message: KmqMessage) -> None:
        note_and_fail_once()

    def sync_handler(message: KmqMessage) -> None:
        note_and_fail_once()

    producer = KmqProducer(settings)
    producer.send(queue.topic, b"order-3")
    assert producer.flush() == 0

    # when a worker of that concurrency handles it
    handler = async_handler if is_async else sync_handler
    worker = Worker(queue, handler, concurrency=concurrency, ordering=Ordering.UNORDERED)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        retry_topic = queue.queue.retry_topics[DELAY_MS]
        assert wait_for(lambda: finished(exporter, f"process {retry_topic}"), 30), "no retry"
    finally:
        stop.set()
        thread.join(60)

    # then each call ran inside its own process span (the handler's spans are its children),
    # and the retry copy is the child of the failed call's span
    (first,) = finished(exporter, f"process {queue.topic}")
    (retry,) = finished(exporter, f"retry {retry_topic}")
    (second,) = finished(exporter, f"process {retry_topic}")
    assert current == [span_id(first), span_id(second)]
    assert parent_id(retry) == span_id(first) and parent_id(second) == span_id(retry)


def test_a_message_waiting_for_its_key_shows_the_wait_on_its_process_span(
    settings: KmqSettings, topic_name: str, exporter: InMemorySpanExporter
) -> None:
    # given three messages of key a and one of key b on one partition, and a handler whose
    # work takes 100 ms
    queue = new_queue(settings, topic_name)
    producer = KmqProducer(settings)
    for key in (b"a", b"a", b"a", b"b"):
        producer.send(queue.topic, key, key=key)
    assert producer.flush() == 0

    def handler(message: KmqMessage) -> None:
        time.sleep(WORK_S)  # the handler's work, not a wait for a condition

    # when a worker runs two calls at once in key order
    worker = Worker(queue, handler, concurrency=2, ordering=Ordering.KEY)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        assert wait_for(lambda: len(finished(exporter, f"process {queue.topic}")) == 4, 30)
    finally:
        stop.set()
        thread.join(60)

    # then each later message of key a waited for the one before it, and b for nobody
    waits: dict[int, int] = {}
    for span in finished(exporter, f"process {queue.topic}"):
        attributes = dict(span.attributes or {})
        offset, wait_ms = attributes["messaging.kafka.offset"], attributes[ORDERING_WAIT_MS]
        assert isinstance(offset, int) and isinstance(wait_ms, int)
        waits[offset] = wait_ms
    work_ms = WORK_S * 1000
    assert waits[1] >= work_ms / 2, waits
    assert waits[2] >= waits[1] + work_ms / 2, waits
    assert waits[3] < waits[1], waits  # b ran beside a's first call


def test_a_delayed_message_stays_in_its_trace_through_every_hop_of_the_delay_ladder(
    settings: KmqSettings, topic_name: str, exporter: InMemorySpanExporter
) -> None:
    # given a queue with delay topics, its forwarder and a worker
    queue = new_queue(settings, topic_name, delay_queue=True)
    level_topic = delay_topic(queue.topic, DELAY_LEVELS_MS[0])
    seen: list[KmqMessage] = []
    with running_service(DelayForwarder(settings, queue.topic)) as forwarder:
        assert wait_for(forwarder.assignment_ready, timeout_s=60)
        # when a message is sent 2.5 s ahead: to the 1 s level, again to it, then delivered
        producer = KmqProducer(settings)
        producer.send(queue.topic, b"later", delay=2.5)
        assert producer.flush() == 0
        with running_worker(queue, seen.append):
            assert wait_for(lambda: finished(exporter, f"process {queue.topic}"), 30)

    # then the send, each hop, the delivery and the processing are one trace, hop after hop
    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    assert [span.name for span in spans] == [
        f"send {queue.topic}",
        f"delay {level_topic}",
        f"deliver {queue.topic}",
        f"process {queue.topic}",
    ]
    assert len({span.context.trace_id for span in spans if span.context}) == 1
    assert [parent_id(span) for span in spans[1:]] == [span_id(span) for span in spans[:-1]]
    assert [m.value for m in seen] == [b"later"]


def _provider_of(exporter: InMemorySpanExporter) -> TracerProvider:
    """The provider kmq traces into (set by the ``exporter`` fixture)."""
    from kmq_dagster import tracing

    provider = tracing._providers.override
    assert isinstance(provider, TracerProvider)
    return provider


OFF_SCRIPT = """
import sys
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.settings import KmqSettings

producer = KmqProducer(KmqSettings.from_env())
producer.send(sys.argv[1], b"plain", headers={"user": "kept"})
assert producer.flush() == 0
HandlerCall(lambda message: None)(type("M", (), {"topic": "t", "partition": 0, "offset": 0,
                                                  "headers": []})())
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def _sent_by_script(settings: KmqSettings, topic: str, script: str) -> tuple[str, Headers]:
    """Run ``script`` in a new Python process given the broker and ``topic``: what it printed,
    and the headers of the one message it sent to ``topic``."""
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    result = subprocess.run(
        [sys.executable, "-c", script, topic],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (record,) = read_topic(settings, topic, 1, at_least=1)
    return result.stdout, normalize_headers(record.headers())


def test_without_a_tracer_provider_nothing_of_opentelemetry_is_imported_or_written(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a queue, and a process that installed OpenTelemetry but configured no tracing
    queue = new_queue(settings, topic_name)

    # when it sends a message and calls a handler
    output, headers = _sent_by_script(settings, queue.topic, OFF_SCRIPT)

    # then OpenTelemetry was never imported, and the message carries no trace header
    assert output.strip() == "[]"
    assert headers == [("user", b"kept")]
    assert header_value(headers, "traceparent") is None


SEND_SCRIPT = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from kmq_dagster.cli import main

provider = TracerProvider()
trace.set_tracer_provider(provider)
with trace.get_tracer("ops").start_as_current_span("deploy") as span:
    print(format(span.get_span_context().trace_id, "032x"), flush=True)
    assert main(["send", "--topic", sys.argv[1], "--value", "v"]) == 0
"""


def test_kmq_send_writes_the_trace_context_of_the_application_span(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a process whose application configured a global tracer provider
    queue = new_queue(settings, topic_name)

    # when `kmq send` runs in it, inside a span
    output, headers = _sent_by_script(settings, queue.topic, SEND_SCRIPT)

    # then the message carries a W3C traceparent in that span's trace
    trace_id = output.split()[0]
    traceparent = header_value(headers, "traceparent")
    assert traceparent is not None
    version, carried_trace_id, _, flags = traceparent.decode().split("-")
    assert (version, carried_trace_id) == ("00", trace_id)
    assert int(flags, 16) & 1  # sampled


def test_tracing_never_stops_on_a_malformed_traceparent(exporter: InMemorySpanExporter) -> None:
    # given a record whose traceparent header is garbage
    from kmq_dagster.worker.handler_call import HandlerCall

    message = type(
        "M", (), {"topic": "t", "partition": 0, "offset": 7, "headers": [("traceparent", b"\xff")]}
    )()
    done = threading.Event()

    # when a handler is called on it, then the call runs in a fresh trace
    HandlerCall(lambda m: done.set(), group="g")(message)
    assert done.is_set()
    (span,) = finished(exporter, "process t")
    assert span.parent is None and span.links == ()
