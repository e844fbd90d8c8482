"""``kmq bench ack``'s runs of what users run: the public :class:`Worker`, held against a plain
consumer doing the same no-op work.

* ``plain_noop``: a plain confluent-kafka consumer fetching ``consume()`` batches, calling a
  no-op Python function per message and committing asynchronously after each batch (the run
  ends with a synchronous commit of its positions: done means committed).
* ``worker_n1``: ``Worker(opened, handler)`` as a user builds it (concurrency 1, the default
  ordering), with a no-op handler.
* ``worker_n100_sync`` / ``worker_n100_async``: ``Worker`` at concurrency 100, unordered (the
  ordering a user picks for speed: it promises nothing to wait for), with a sync no-op handler
  (run on the worker's threads) and an ``async def`` one (run on its event loop).

Every handler, the plain consumer's included, does the same bookkeeping per message (notes the
first call's start and which message returned: :class:`CallLog`), so a run that lost a message
shows it. Each run drains a fresh queue (filled beforehand) and is timed from the first handler
call to the last acknowledgement, the group join excluded (:func:`timed_drain`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message

from kmq_dagster.bench.parallel_runs import (
    STALL_TIMEOUT_S,
    CallLog,
    Drain,
    async_no_op,
    filled_queue,
    no_op,
    timed_drain,
)
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.errors import ConfigError
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import use_tracer_provider

#: The runs, in the order of the first round (later rounds rotate it).
WORKER_RUNS = ("plain_noop", "worker_n1", "worker_n100_sync", "worker_n100_async")
#: ``worker_n1`` with OpenTelemetry tracing on (``kmq bench ack --tracing``).
TRACED_RUN = "worker_n1_traced"
#: Keys of the filled queues (they only place messages on partitions: key k on k % p).
KEYS = 100
#: Handler calls at once in the concurrent runs.
CONCURRENCY = 100
#: Messages per run by default: a few seconds each for Worker at concurrency 1.
DEFAULT_WORKER_MESSAGES = 200_000


def plain_drain(
    settings: KmqSettings,
    topic: str,
    messages: int,
    handle: Callable[[Message], object],
    *,
    commit_async: bool,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> Drain:
    """A plain at-least-once consumer of ``topic`` (holding ``messages``): ``consume()``
    batches, ``handle`` per message, a commit after every batch (with ``commit_async`` one that
    does not wait for the broker, and a synchronous commit of the positions at the end).

    Timed from the first batch (its first handler call) to the last commit's return.
    """
    consumer = Consumer(settings.consumer_config(f"plain-{topic}"))
    consumer.subscribe([topic])
    received = 0
    started = (0.0, 0.0)
    last_progress_s = time.monotonic()
    try:
        while received < messages:
            # Fetched the way KmqConsumer fetches: what is here, else wait for more.
            fetched = consumer.consume(settings.batch_size, 0) or consumer.consume(
                settings.batch_size, 1.0
            )
            batch = [m for m in fetched if m.error() is None]
            if not batch:
                if time.monotonic() - last_progress_s > stall_timeout_s:
                    break  # the counts say what is missing
                continue
            if not started[0]:
                started = (time.perf_counter(), time.process_time())
            last_progress_s = time.monotonic()
            for message in batch:
                handle(message)
            received += len(batch)
            if commit_async:
                consumer.commit(asynchronous=True)
            else:
                consumer.commit(asynchronous=False)
        if commit_async and received:
            # Explicit offsets: with everything committed already, commit() raises NO_OFFSET.
            positions = consumer.position(consumer.assignment())
            consumer.commit(offsets=positions, asynchronous=False)
        ended = (time.perf_counter(), time.process_time())
    finally:
        consumer.close()
    started = started if started[0] else ended
    return Drain(
        seconds=ended[0] - started[0],
        handled=received,
        acked=received,
        cpu_s=ended[1] - started[1],
        started_at_s=started[0],
        ended_at_s=ended[0],
    )


def plain_noop_drain(settings: KmqSettings, messages: int, partitions: int) -> Drain:
    """``plain_noop``: a plain consumer with the worker runs' no-op handler bookkeeping."""
    opened = filled_queue(settings, messages, KEYS, partitions)
    calls = CallLog(messages)

    def handle(message: Message) -> None:  # parallel_runs.no_op, on a confluent record
        calls.started()
        calls.returned[int(message.value() or b"0")] = 1

    drain = plain_drain(settings, opened.topic, messages, handle, commit_async=True)
    return dataclasses.replace(drain, handled=calls.handled)


def worker_plan(
    messages: int, partitions: int, *, tracing: bool = False
) -> dict[str, Callable[[KmqSettings], Drain]]:
    """Every run by name: fill a fresh queue on the given cluster, then drain it. With
    ``tracing``, ``worker_n1_traced`` too: ``worker_n1`` with OpenTelemetry tracing on."""

    def worker(
        concurrency: int, ordering: Ordering, use_async: bool
    ) -> Callable[[KmqSettings], Drain]:
        def run(settings: KmqSettings) -> Drain:
            opened = filled_queue(settings, messages, KEYS, partitions)
            handler = async_no_op if use_async else no_op
            return timed_drain(
                opened, messages, handler, concurrency=concurrency, ordering=ordering
            )

        return run

    def traced(settings: KmqSettings) -> Drain:
        opened = filled_queue(settings, messages, KEYS, partitions)
        with tracing_on():
            return timed_drain(opened, messages, no_op, concurrency=1, ordering=Ordering.PARTITION)

    plan = {
        "plain_noop": lambda settings: plain_noop_drain(settings, messages, partitions),
        # Worker's default ordering: what Worker(opened, handler) runs.
        "worker_n1": worker(1, Ordering.PARTITION, use_async=False),
        "worker_n100_sync": worker(CONCURRENCY, Ordering.UNORDERED, use_async=False),
        "worker_n100_async": worker(CONCURRENCY, Ordering.UNORDERED, use_async=True),
    }
    if tracing:
        require_tracing_sdk()  # before the first run, not after minutes of them
        plan[TRACED_RUN] = traced
    return plan


def require_tracing_sdk() -> None:
    """Check that the traced run can run.

    Raises:
        ConfigError: the OpenTelemetry SDK (``opentelemetry-sdk``) is not installed.
    """
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--tracing needs the OpenTelemetry SDK: pip install opentelemetry-sdk",
            setting="tracing",
        ) from None


@contextmanager
def tracing_on(exporter: Any = None) -> Iterator[None]:
    """kmq traces into an OpenTelemetry SDK provider whose spans are batched and dropped (or
    given to ``exporter``): the cost of kmq's tracing and the SDK, not of an exporter's network.

    Raises:
        ConfigError: the OpenTelemetry SDK is not installed.
    """
    require_tracing_sdk()
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter or Dropped()))
    use_tracer_provider(provider)
    try:
        yield
    finally:
        use_tracer_provider(None)
        provider.shutdown()


@dataclass
class WorkerFigures:
    """The drains of the worker runs, one per round each."""

    messages: int
    runs: dict[str, list[Drain]] = field(default_factory=lambda: {n: [] for n in WORKER_RUNS})
    #: With the ``worker_n1_traced`` run (``--tracing``).
    traced: bool = False

    def __post_init__(self) -> None:
        if self.traced:
            self.runs.setdefault(TRACED_RUN, [])

    def rate(self, name: str) -> float:
        return statistics.median(d.msgs_per_s for d in self.runs[name])

    def ratios(self) -> list[float]:
        """Per round: Worker at concurrency 1 / the plain no-op consumer, same round."""
        return [
            w.msgs_per_s / p.msgs_per_s if p.msgs_per_s else 0.0
            for w, p in zip(self.runs["worker_n1"], self.runs["plain_noop"], strict=True)
        ]

    def ratio(self) -> float:
        return statistics.median(self.ratios())

    def handled(self, name: str) -> int:
        """The fewest messages handled and acknowledged in any round of ``name``."""
        return min(min(d.handled, d.acked) for d in self.runs[name])

    def table(self) -> list[str]:
        lines = [f"{'run':<20} {'median':>10} {'rounds':>26} {'cpu/wall':>8} {'handled':>9}"]
        for name, drains in self.runs.items():
            rounds = " / ".join(f"{d.msgs_per_s / 1000:.1f}k" for d in drains)
            cpu = statistics.median(d.cpu_s / d.seconds if d.seconds else 0.0 for d in drains)
            lines.append(
                f"{name:<20} {self.rate(name) / 1000:>7.1f}k/s {rounds:>26} {cpu:>8.2f} "
                f"{self.handled(name):>9,}"
            )
        lines.append(
            f"worker_ratio (worker_n1 / plain_noop, median of rounds) {self.ratio():.3f} "
            f"(rounds: {', '.join(f'{r:.3f}' for r in self.ratios())})"
        )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker_ratio": round(self.ratio(), 3),
            "worker_msgs_per_s": round(self.rate("worker_n1")),
            "plain_noop_msgs_per_s": round(self.rate("plain_noop")),
            "worker_n100_sync_msgs_per_s": round(self.rate("worker_n100_sync")),
            "worker_n100_async_msgs_per_s": round(self.rate("worker_n100_async")),
            "worker_messages": self.messages,
            "worker_handled": {name: self.handled(name) for name in self.runs},
        } | self.traced_figures()

    def traced_figures(self) -> dict[str, Any]:
        """``--tracing``'s figures (none without it)."""
        if not self.traced:
            return {}
        return {
            "worker_n1_traced_msgs_per_s": round(self.rate(TRACED_RUN)),
            # Per round: traced / untraced Worker at concurrency 1, same round.
            "tracing_ratio": round(
                statistics.median(
                    t.msgs_per_s / w.msgs_per_s if w.msgs_per_s else 0.0
                    for t, w in zip(self.runs[TRACED_RUN], self.runs["worker_n1"], strict=True)
                ),
                3,
            ),
        }
