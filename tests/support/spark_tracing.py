"""Functions for the Spark tracing tests: Spark's Python workers are other processes than the
test's, so these functions trace there into a file the test reads, as an application would
configure OpenTelemetry in its executors.

A function object is pickled to every task; unpickling it in a Python worker installs a tracer
provider that writes each ended span as one JSON line to ``<path>.spans``, and the function
notes the span current in each of its calls as ``call <offset> <span id>`` in ``path``. The
provider goes again when the function object is collected (Python workers are reused by later
tests), and writes nothing once the test's directory is gone.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from kmq_dagster import tracing
from kmq_dagster.spark.message import SparkMessage
from tests.support.line_files import append_line

#: The value of a message the functions fail on (a ``ValueError``).
BAD = b"bad"


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as JSON: name, ids, parent id, attributes, status."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not Path(self.path).parent.is_dir():  # the test that asked is over
            return SpanExportResult.SUCCESS
        for span in spans:
            assert span.context is not None
            append_line(
                self.path,
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": span.context.trace_id,
                        "span_id": span.context.span_id,
                        "parent_id": span.parent.span_id if span.parent else None,
                        "attributes": dict(span.attributes or {}),
                        "status": span.status.status_code.name,
                    }
                ),
            )
        return SpanExportResult.SUCCESS


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans the executors wrote for the function recording into ``path``."""
    spans = Path(f"{path}.spans")
    return [json.loads(line) for line in spans.read_text().splitlines()] if spans.exists() else []


def _uninstall(provider: TracerProvider) -> None:
    if tracing._providers.override is provider:  # not a later test's provider
        tracing.use_tracer_provider(None)
    provider.shutdown()


class _Traced:
    """Installs the tracing provider where it is unpickled (see the module docstring)."""

    def __init__(self, path: str, wait_s: float = 0.05) -> None:
        self.path = path
        self.wait_s = wait_s

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(f"{self.path}.spans")))
        tracing.use_tracer_provider(provider)
        weakref.finalize(self, _uninstall, provider)

    def _note(self, message: SparkMessage) -> None:
        span_id = trace.get_current_span().get_span_context().span_id
        append_line(self.path, f"call {message.offset} {span_id}")
        if message.value == BAD:
            raise ValueError("a bad order")


class TracedAsyncEcho(_Traced):
    """``async``: awaits ``wait_s`` of I/O, notes its span, returns the value."""

    async def __call__(self, message: SparkMessage) -> str:
        await asyncio.sleep(self.wait_s)
        self._note(message)
        return (message.value or b"").decode()


class TracedSyncEcho(_Traced):
    """Sync (runs on the task's thread pool): ``wait_s`` of blocking I/O, notes its span,
    returns the value."""

    def __call__(self, message: SparkMessage) -> str:
        time.sleep(self.wait_s)  # the function's I/O: other calls run meanwhile
        self._note(message)
        return (message.value or b"").decode()
