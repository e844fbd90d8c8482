"""kmq_dagster.tracing without a broker: trace headers replace the previous hop's, and a
tracing failure never keeps a message from being sent, copied or handled."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kmq_dagster import tracing
from kmq_dagster.tracing import copied_headers, sent_headers, tracing_active, use_tracer_provider
from kmq_dagster.worker.handler_call import HandlerCall


def test_tracing_is_off_until_a_tracer_provider_is_configured() -> None:
    # given OpenTelemetry imported (by this test) but no provider set, then nothing is traced
    assert not tracing_active()
    assert sent_headers("orders", [("user", b"1")]) == [("user", b"1")]


# A global provider is set once a process: each case runs in a fresh interpreter.
_SET_LATER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from kmq_dagster.tracing import tracing_active

print(tracing_active())
trace.set_tracer_provider(TracerProvider())
print(tracing_active())
"""
_NAMED_BY_ENV = """
import opentelemetry.trace
from kmq_dagster.tracing import tracing_active

print(tracing_active())
"""


def _printed(script: str, **env: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_global_provider_set_after_kmq_found_none_turns_tracing_on() -> None:
    # given OpenTelemetry imported and nothing configured: off (and found off cheaply), then
    # when the application sets a global provider, kmq traces from then on
    assert _printed(_SET_LATER) == ["False", "True"]


def test_a_provider_named_by_the_environment_turns_tracing_on() -> None:
    # OpenTelemetry loads the provider OTEL_PYTHON_TRACER_PROVIDER names on first use
    assert _printed(_NAMED_BY_ENV, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider") == ["True"]


def test_a_copy_carries_its_own_trace_context_in_place_of_the_previous_hops(
    exporter: InMemorySpanExporter,
) -> None:
    # given a record sent with a trace context, and a user header after it
    sent = [*sent_headers("orders", [("user", b"1")]), ("later", b"2")]
    # when it is copied
    copied = copied_headers(
        "retry", "orders.g.retry.1s", sent, source=("orders", 0, 5), source_headers=sent
    )
    # then the copy has one traceparent, the copy span's, and the user headers in order
    spans = {span.name: span for span in exporter.get_finished_spans()}
    copy_context = spans["retry orders.g.retry.1s"].context
    assert copy_context is not None
    names = [name for name, _ in copied]
    assert names.count("traceparent") == 1
    assert [n for n in names if n != "traceparent"] == ["user", "later"]
    traceparent = dict(copied)["traceparent"]
    assert traceparent is not None
    assert traceparent.decode().split("-")[2] == format(copy_context.span_id, "016x")


class _Message:
    topic, partition, offset, headers = "orders", 0, 1, [("traceparent", b"\xff")]


class _BrokenProvider:
    """A tracer provider whose spans cannot be started (a misconfigured SDK, say)."""

    def get_tracer(self, name: str) -> Any:
        return self

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter misconfigured")

    start_as_current_span = start_span


def test_a_tracing_failure_never_keeps_a_message_from_being_sent_copied_or_handled() -> None:
    use_tracer_provider(_BrokenProvider())
    try:
        headers = [("user", b"1")]
        assert sent_headers("orders", headers) == headers
        copied = copied_headers("replay", "t", headers, source=("t", 0, 1), source_headers=[])
        assert copied == headers
        called: list[object] = []
        HandlerCall(called.append)(_Message())
        assert len(called) == 1
    finally:
        use_tracer_provider(None)
        tracing._providers.cached = None


def test_a_spark_function_call_is_a_span_of_the_message_trace(
    exporter: InMemorySpanExporter,
) -> None:
    # given two messages sent with tracing, as a Spark task reads them
    from kmq_dagster.spark.message import SparkMessage
    from kmq_dagster.spark.process import FAILED, call_function

    chunk = [
        SparkMessage("orders", 1, offset, None, value, tuple(sent_headers("orders", [])))
        for offset, value in ((7, b"ok"), (8, b"bad"))
    ]

    def function(message: SparkMessage) -> bytes:
        if message.value == b"bad":
            raise ValueError("bad order")
        return b"done"

    # when the task calls the function on them
    outcome = call_function(function, chunk, stop_at=float("inf"), group="billing")

    # then each call is a process span, the child of its message's send, and the failure says so
    assert outcome.results == [b"done", FAILED]
    sends = [s for s in exporter.get_finished_spans() if s.name == "send orders"]
    calls = [s for s in exporter.get_finished_spans() if s.name == "process orders"]
    assert [c.parent.span_id if c.parent else None for c in calls] == [
        s.context.span_id if s.context else None for s in sends
    ]
    assert [dict(c.attributes or {})["messaging.kafka.offset"] for c in calls] == [7, 8]
    assert {dict(c.attributes or {})["messaging.consumer.group.name"] for c in calls} == {"billing"}
    assert dict(calls[1].attributes or {})["error.type"] == "ValueError"
