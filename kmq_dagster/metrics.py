"""Prometheus metrics of kmq's long-running services (``--metrics-port``).

Nothing is counted twice: each service already keeps counters for its log and its tests, and a
:class:`ServiceMetrics` collector reads them when Prometheus scrapes, so the message path pays
nothing for metrics. Every metric carries the labels ``topic``, ``group`` and ``service``
(``worker``, ``tracker``, ``delayer``, ``spark``).

| metric | type | from |
|---|---|---|
| ``kmq_acks_total`` | counter | worker: messages acknowledged (processed, or their copy written) |
| ``kmq_processed_total`` | counter | worker, spark: handler calls that returned |
| ``kmq_handler_failures_total`` | counter | worker, spark: handler calls that raised |
| ``kmq_redeliveries_total`` | counter | tracker: copies to the redelivery topic |
| ``kmq_retries_total`` | counter | worker: copies to a retry topic, retries in place (key order) |
| ``kmq_dead_letters_total`` | counter | worker, tracker: copies to the DLQ |
| ``kmq_delayed_delivered_total`` | counter | delayer: delayed messages delivered when due |
| ``kmq_in_flight`` | gauge | tracker: unacknowledged messages; worker: handed out, not yet acked |
| ``kmq_oldest_unacked_age_seconds`` | gauge | tracker: age of the oldest unacknowledged message |
| ``kmq_calls_in_flight`` | gauge | worker: handler calls running now |
| ``kmq_held_messages`` | gauge | worker: fetched messages waiting to start |
| ``kmq_call_wait_seconds`` | histogram | worker: fetch to start, by ``ordering`` |
| ``kmq_breaker_state`` | gauge | worker with ``--breaker``: 1 for the current ``state`` label |
| ``kmq_client_errors_total`` | counter | every service: Kafka client errors by ``error`` name |

Examples:
    >>> server = serve_metrics(9400, ServiceMetrics("tracker", queue.topic, queue.group,
    ...                                             lambda: tracker_snapshot(tracker)))
    ...                                                               # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from threading import Thread
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.errors import ConfigError

if TYPE_CHECKING:
    from kmq_dagster.kafka.delay_forwarder import DelayForwarder
    from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
    from kmq_dagster.spark.processing import ProcessingReport
    from kmq_dagster.worker.worker import Worker

#: Every state a breaker can be in, for ``kmq_breaker_state``.
BREAKER_STATES = ("closed", "open", "half_open")
#: Address the metrics server binds: every interface, as Prometheus exporters do.
METRICS_ADDRESS = "0.0.0.0"

_COUNTERS = {
    "acks": "Messages acknowledged",
    "processed": "Handler calls that returned",
    "handler_failures": "Handler calls that raised",
    "redeliveries": "Unacknowledged messages copied to the redelivery topic",
    "retries": "Failed messages retried (copied to a retry topic, or in place in key order)",
    "dead_letters": "Messages copied to the dead-letter topic",
    "delayed_delivered": "Delayed messages delivered to the queue topic when due",
}


@dataclass
class Snapshot:
    """A service's figures at one moment; ``None`` where the service has no such figure."""

    acks: int | None = None
    processed: int | None = None
    handler_failures: int | None = None
    redeliveries: int | None = None
    retries: int | None = None
    dead_letters: int | None = None
    delayed_delivered: int | None = None
    in_flight: int | None = None
    oldest_unacked_age_s: float | None = None
    breaker_state: str | None = None
    calls_in_flight: int | None = None
    held_messages: int | None = None
    #: Fetch-to-start waits, labelled with ``ordering``.
    call_waits: WaitHistogram | None = None
    ordering: str | None = None
    client_errors: Mapping[str, int] = field(default_factory=dict)


class ServiceMetrics(Collector):
    """Turns ``read()`` into metric families at each scrape.

    Args:
        service: ``worker``, ``tracker``, ``delayer`` or ``spark``.
        read: returns the service's current :class:`Snapshot`; called on the server's thread,
            so it must only read counters the service updates.
    """

    def __init__(self, service: str, topic: str, group: str, read: Callable[[], Snapshot]):
        self.labels = {"topic": topic, "group": group, "service": service}
        self.read = read

    def collect(self) -> Iterator[Metric]:
        snapshot = self.read()
        names, values = list(self.labels), list(self.labels.values())
        for name, help_text in _COUNTERS.items():
            value = getattr(snapshot, name)
            if value is not None:
                counter = CounterMetricFamily(f"kmq_{name}", help_text, labels=names)
                counter.add_metric(values, value)
                yield counter
        if snapshot.in_flight is not None:
            yield _gauge("kmq_in_flight", "Messages not yet acknowledged", names, values,
                         snapshot.in_flight)  # fmt: skip
        if snapshot.oldest_unacked_age_s is not None:
            yield _gauge(
                "kmq_oldest_unacked_age_seconds",
                "Age of the oldest unacknowledged message",
                names,
                values,
                snapshot.oldest_unacked_age_s,
            )
        yield from _worker_families(snapshot, names, values)
        if snapshot.breaker_state is not None:
            breaker = GaugeMetricFamily(
                "kmq_breaker_state", "Circuit breaker state (1: current)", labels=[*names, "state"]
            )
            for state in BREAKER_STATES:
                breaker.add_metric([*values, state], float(state == snapshot.breaker_state))
            yield breaker
        errors = CounterMetricFamily(
            "kmq_client_errors", "Kafka client errors", labels=[*names, "error"]
        )
        for error, count in sorted(snapshot.client_errors.items()):
            errors.add_metric([*values, error], count)
        yield errors


def _worker_families(snapshot: Snapshot, names: list[str], values: list[str]) -> Iterator[Metric]:
    if snapshot.calls_in_flight is not None:
        yield _gauge("kmq_calls_in_flight", "Handler calls running", names, values,
                     snapshot.calls_in_flight)  # fmt: skip
    if snapshot.held_messages is not None:
        yield _gauge("kmq_held_messages", "Fetched messages waiting to start", names, values,
                     snapshot.held_messages)  # fmt: skip
    waits = snapshot.call_waits
    if waits is not None:
        histogram = HistogramMetricFamily(
            "kmq_call_wait_seconds",
            "Time from fetch to a message's first call start",
            labels=[*names, "ordering"],
        )
        buckets = waits.cumulative()
        histogram.add_metric([*values, snapshot.ordering or ""], buckets, waits.sum_s)
        yield histogram


def _gauge(name: str, help_text: str, names: list[str], values: list[str], value: float) -> Any:
    gauge = GaugeMetricFamily(name, help_text, labels=names)
    gauge.add_metric(values, value)
    return gauge


class MetricsServer:
    """An HTTP server answering ``/metrics`` on ``port`` until :meth:`close`."""

    def __init__(self, port: int, collectors: list[Collector]) -> None:
        self.registry = CollectorRegistry()
        for collector in collectors:
            self.registry.register(collector)
        try:
            self._server, self._thread = start_http_server(
                port, addr=METRICS_ADDRESS, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on port {port}: {exc.strerror}", setting="metrics_port"
            ) from None
        self.port = port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        thread: Thread = self._thread
        thread.join(timeout=5)


def serve_metrics(port: int, collector: Collector) -> MetricsServer:
    """Serve ``collector``'s metrics on ``port`` (all interfaces) from a background thread.

    Raises:
        ConfigError: the port cannot be bound (in use, or privileged).
    """
    return MetricsServer(port, [collector])


# -- what each service reports -------------------------------------------------------------


def worker_snapshot(worker: Worker) -> Snapshot:
    """A :class:`~kmq_dagster.worker.worker.Worker`'s figures."""
    consumer, router, stats = worker.consumer.stats, worker.router.stats, worker.stats
    errors = dict(consumer.client_errors.by_name)
    return Snapshot(
        acks=consumer.acked,
        processed=stats.handled,
        handler_failures=stats.failed,
        retries=router.retried + stats.retried_in_place,
        dead_letters=router.dead_lettered,
        in_flight=max(0, consumer.fetched - consumer.acked),
        breaker_state=None if worker.breaker is None else worker.breaker.state.value,
        calls_in_flight=stats.calls_in_flight,
        held_messages=stats.held,
        call_waits=stats.waits,
        ordering=worker.ordering.value,
        client_errors=errors,
    )


def tracker_snapshot(tracker: RedeliveryTracker, now_ms: int) -> Snapshot:
    """A :class:`~kmq_dagster.kafka.redelivery_tracker.RedeliveryTracker`'s figures."""
    stats = tracker.stats
    oldest = stats.oldest_open_deadline_ms
    age_s = None
    if oldest is not None:
        age_s = max(0.0, (now_ms - (oldest - tracker.queue.visibility_timeout_ms)) / 1000)
    return Snapshot(
        redeliveries=stats.redelivered,
        dead_letters=stats.dead_lettered,
        in_flight=stats.in_flight,
        oldest_unacked_age_s=age_s if age_s is not None else 0.0,
        client_errors=dict(stats.client_errors.by_name),
    )


def delayer_snapshot(forwarder: DelayForwarder) -> Snapshot:
    """A :class:`~kmq_dagster.kafka.delay_forwarder.DelayForwarder`'s figures."""
    stats = forwarder.stats
    return Snapshot(
        delayed_delivered=stats.delivered, client_errors=dict(stats.client_errors.by_name)
    )


def spark_snapshot(totals: ProcessingReport) -> Snapshot:
    """A Spark job's figures, from the totals of its finished batches."""
    return Snapshot(processed=totals.succeeded, handler_failures=totals.failed)


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> dict[str, float]:
    """Read ``http://host:port/metrics``: sample name -> value, summed over label sets.

    Raises:
        OSError: nothing answered.
    """
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
