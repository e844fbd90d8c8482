"""OpenTelemetry traces across a message's hops: every OpenTelemetry use of kmq is here.

Tracing is optional (``pip install 'kmq-dagster[otel]'``) and costs nothing when off: this
module imports ``opentelemetry`` only once the application has (it never does so first). It
traces only when the application has configured a tracer provider
(``opentelemetry.trace.set_tracer_provider``, which imports ``opentelemetry.trace``) or handed
one to :func:`use_tracer_provider`; otherwise :func:`tracing_active` is a dictionary lookup
(and an attribute read, where the application imported OpenTelemetry and set nothing) and no
header is added. ``OTEL_PYTHON_TRACER_PROVIDER`` is read once a process.

When on, the trace context travels in W3C ``traceparent`` / ``tracestate`` headers (through
OpenTelemetry's configured propagator) and each hop is a span in the message's trace:

* ``send <topic>`` (producer): :class:`~kmq_dagster.kafka.producer.KmqProducer` and ``kmq send``;
* ``process <topic>`` (consumer): one handler call (worker, or Spark function), a child of the
  context the record carries; a concurrent one says how long its message waited to start
  (:data:`ORDERING_WAIT_MS`);
* ``retry <topic>``, ``dead-letter <topic>`` (producer): a copy the retry router writes, a child
  of the failed call's span;
* ``redeliver <topic>``, ``replay <topic>`` (producer): a copy the tracker or a replay writes, a
  child of the context the copied record carries;
* ``delay <level topic>``, ``deliver <topic>`` (producer): a delayed message's move down the
  delay ladder and its delivery when due, by the delay forwarder.

Every span but ``send`` links to the context its record carried (the span of the hop it came
from), and every copy carries its own span's context on, so one trace reads
send -> process (failed) -> retry -> process (failed) -> dead-letter -> replay -> process.
Attributes follow OpenTelemetry's messaging conventions (``messaging.*``) plus ``kmq.*`` ones.
Error text is data (invariant 13): a failed call's span records the error's type, never its
message or traceback. A tracing failure never stops a message: it is logged and skipped.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

from kmq_dagster.core.headers import GROUP, REDELIVERY_COUNT, Headers, header_value, int_header
from kmq_dagster.core.retry_headers import read_attempt

log = logging.getLogger(__name__)

#: The instrumentation scope of kmq's spans.
TRACER_NAME = "kmq_dagster"
#: Failed calls whose span a copy may still name as its parent, per process (oldest dropped).
MAX_FAILED_CALLS = 10_000
#: A ``process`` span's attribute: ms from the message's fetch (or, in Spark, its chunk's
#: start) to its call's start: the wait for its ordering lane and a free call slot.
ORDERING_WAIT_MS = "kmq.ordering.wait_ms"

HeaderList = list[tuple[str, bytes | None]]
#: A record's coordinates: (topic, partition, offset).
Coordinates = tuple[str, int, int]

_failed_calls: OrderedDict[Coordinates, Any] = OrderedDict()
_failed_calls_lock = threading.Lock()


class _Providers:
    """The tracer provider kmq was handed, and the tracer of the provider last used."""

    def __init__(self) -> None:
        self.override: Any = None
        self.cached: tuple[Any, Any] | None = None  # (provider, tracer)


_providers = _Providers()
#: What an OpenTelemetry without the global provider's private name would have there.
_UNKNOWN = object()


@cache
def _provider_named_by_env() -> bool:
    """Whether ``OTEL_PYTHON_TRACER_PROVIDER`` names a provider to load, read once a process.

    ``opentelemetry.trace.get_tracer_provider()`` reads it on every call until a provider is
    set, and a missing variable costs ``os.environ`` a raised ``KeyError``: 1.2 us quiet (3.5
    loaded), with OpenTelemetry imported and nothing configured, on every message sent,
    handled or copied (where a whole message at concurrency 1 costs about 2 us).
    :func:`_tracer` asks OpenTelemetry only when a global provider is set or this variable
    names one.
    """
    return "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def use_tracer_provider(provider: Any | None) -> None:
    """Trace with ``provider`` (an OpenTelemetry ``TracerProvider``) instead of the global one;
    ``None`` goes back to the global provider. OpenTelemetry lets the global provider be set
    once per process: this lets a test, or an application with several, choose kmq's."""
    _providers.override = provider


def _tracer() -> Any | None:
    """kmq's tracer, or ``None`` when no tracer provider is configured (tracing is off)."""
    provider = _providers.override
    if provider is None:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:  # nobody imported OpenTelemetry: nothing is configured
            return None
        if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _provider_named_by_env():
            return None  # imported, nothing set: what get_tracer_provider() would find
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    cached = _providers.cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = provider.get_tracer(TRACER_NAME)
    _providers.cached = (provider, tracer)
    return tracer


def tracing_active() -> bool:
    """True when spans are recorded: a tracer provider is set (see the module docstring)."""
    return _tracer() is not None


@cache
def _carriers() -> tuple[Any, Any]:
    """A getter and a setter over Kafka header lists for OpenTelemetry's propagators (made on
    first use: defining them imports OpenTelemetry)."""
    from opentelemetry.propagators.textmap import Getter, Setter

    class HeaderGetter(Getter[Headers]):
        """Reads a header list (the last value of a name wins, as everywhere in kmq)."""

        def get(self, carrier: Headers, key: str) -> list[str] | None:
            value = header_value(carrier, key)
            return None if value is None else [value.decode("utf-8", errors="replace")]

        def keys(self, carrier: Headers) -> list[str]:
            return [key for key, _ in carrier]

    class HeaderSetter(Setter[HeaderList]):
        """Writes into a header list, replacing the value a previous hop set."""

        def set(self, carrier: HeaderList, key: str, value: str) -> None:
            carrier[:] = [(k, v) for k, v in carrier if k != key]
            carrier.append((key, value.encode()))

    return HeaderGetter(), HeaderSetter()


def _extract(headers: Headers | None) -> Any:
    """The OpenTelemetry context ``headers`` carry (empty when they carry none)."""
    from opentelemetry import propagate

    return propagate.extract(list(headers or ()), getter=_carriers()[0])


def _links_to(context: Any) -> list[Any]:
    """A link to the span ``context`` holds, if it holds a valid one."""
    from opentelemetry import trace

    span_context = trace.get_current_span(context).get_span_context()
    return [trace.Link(span_context)] if span_context.is_valid else []


def _inject(span: Any, headers: Headers | None) -> HeaderList:
    """``headers`` with ``span``'s trace context (``traceparent``, ``tracestate``) set anew."""
    from opentelemetry import propagate, trace

    carrier: HeaderList = list(headers or ())
    propagate.inject(carrier, context=trace.set_span_in_context(span), setter=_carriers()[1])
    return carrier


def _base_attributes(operation: str, kind: str, destination: str) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
        "messaging.destination.name": destination,
    }


def sent_headers(topic: str, headers: Headers | None) -> HeaderList:
    """Record a ``send <topic>`` span (a child of the current span) and return ``headers`` with
    its trace context; ``headers`` unchanged when tracing is off or fails."""
    tracer = _tracer()
    if tracer is None:
        return list(headers or ())
    try:
        from opentelemetry.trace import SpanKind

        attributes = _base_attributes("send", "send", topic)
        with tracer.start_as_current_span(
            f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            return _inject(span, headers)
    except Exception:
        log.warning("tracing the send to %s failed; sent without a trace", topic, exc_info=True)
        return list(headers or ())


def copied_headers(
    operation: str,
    target: str,
    headers: Headers,
    *,
    source: Coordinates,
    source_headers: Headers | None,
    attributes: Mapping[str, Any] | None = None,
) -> HeaderList:
    """Record an ``<operation> <target>`` span for a copy of the record at ``source`` and
    return the copy's ``headers`` with that span's trace context.

    The span's parent is the span of the failed call on ``source`` when this process made one
    (:func:`processing`), else the context ``source_headers`` carry; it links to the latter.

    Args:
        operation: ``retry``, ``dead-letter``, ``redeliver``, ``replay``, ``delay`` or
            ``deliver``.
        attributes: ``kmq.*`` or ``error.type`` attributes to add.
    """
    tracer = _tracer()
    if tracer is None:
        return list(headers)
    try:
        from opentelemetry import trace

        carried = _extract(source_headers)
        failed_call = _pop_failed_call(source)
        parent = carried if failed_call is None else trace.set_span_in_context(failed_call)
        span_attributes = _base_attributes(operation, "send", target)
        span_attributes.update(_source_attributes(source, source_headers))
        span_attributes.update(attributes or {})
        span = tracer.start_span(
            f"{operation} {target}",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes=span_attributes,
            links=_links_to(carried),
        )
        try:
            return _inject(span, headers)
        finally:
            span.end()
    except Exception:
        log.warning("tracing a %s copy failed; copied without a trace", operation, exc_info=True)
        return list(headers)


def _source_attributes(source: Coordinates, headers: Headers | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "kmq.source.topic": source[0],
        "kmq.source.partition": source[1],
        "kmq.source.offset": source[2],
    }
    group = header_value(headers, GROUP)
    if group is not None:
        attributes["messaging.consumer.group.name"] = group.decode("utf-8", errors="replace")
    return attributes


@contextmanager
def processing(
    record: Coordinates,
    headers: Headers | None,
    group: str | None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """A ``process <topic>`` span around one handler call on ``record``, current while the
    handler runs (its own spans are children), continuing the trace ``headers`` carry.

    A call that raises sets the span's status to error with ``error.type`` (the exception's
    type, never its text), and its span is kept for the copy the retry router writes next.
    """
    tracer = _tracer()
    if tracer is None:
        yield
        return
    try:
        span = _start_process_span(tracer, record, headers, group, attributes)
    except Exception:
        log.warning("tracing a handler call failed; called without a trace", exc_info=True)
        yield
        return
    from opentelemetry import trace

    # Error text is data (invariant 13): no exception event, the type only.
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield
        except BaseException as exc:
            _mark_failed(span, record, exc)
            raise


def _start_process_span(
    tracer: Any,
    record: Coordinates,
    headers: Headers | None,
    group: str | None,
    attributes: Mapping[str, Any] | None,
) -> Any:
    from opentelemetry import trace

    topic, partition, offset = record
    carried = _extract(headers)
    span_attributes = _base_attributes("process", "process", topic)
    span_attributes.update(
        {
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": offset,
            "kmq.attempt": _attempt(headers),
            "kmq.redelivery_count": _redelivery_count(headers),
        }
    )
    if group is not None:
        span_attributes["messaging.consumer.group.name"] = group
    span_attributes.update(attributes or {})
    return tracer.start_span(
        f"process {topic}",
        context=carried,
        kind=trace.SpanKind.CONSUMER,
        attributes=span_attributes,
        links=_links_to(carried),
    )


def _mark_failed(span: Any, record: Coordinates, exc: BaseException) -> None:
    """Status error with ``error.type``; the span is kept for the copy written next."""
    try:
        from opentelemetry import trace

        error_type = type(exc).__qualname__
        span.set_attribute("error.type", error_type)
        span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))
        _keep_failed_call(record, span)
    except Exception:
        log.warning("tracing a failed handler call failed", exc_info=True)


def _attempt(headers: Headers | None) -> int:
    try:
        return read_attempt(headers)
    except ValueError:
        return 0


def _redelivery_count(headers: Headers | None) -> int:
    try:
        return int_header(headers, REDELIVERY_COUNT) or 0
    except ValueError:
        return 0


def _keep_failed_call(record: Coordinates, span: Any) -> None:
    with _failed_calls_lock:
        _failed_calls[record] = span
        _failed_calls.move_to_end(record)
        while len(_failed_calls) > MAX_FAILED_CALLS:
            _failed_calls.popitem(last=False)


def _pop_failed_call(record: Coordinates) -> Any | None:
    with _failed_calls_lock:
        return _failed_calls.pop(record, None)
