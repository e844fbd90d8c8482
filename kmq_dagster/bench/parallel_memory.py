"""``kmq bench parallel --rss-backlog N``: the worker's memory while a large backlog drains.

A queue is filled with ``N`` messages first (in this process); then a separate worker process
(spawned, so its memory holds nothing of the filling producer) drains it through the real
``Worker``, with an ``async def`` handler awaiting 20 ms at concurrency 1,000 (unordered), and
samples its own resident memory (``VmRSS`` in ``/proc/self/status``) every second. Bounded
memory (invariant 11) means the samples stay flat: the worker holds at most ``max_buffered``
fetched messages (plus librdkafka's own prefetch, bounded by its settings), however many wait
on the broker.
"""

from __future__ import annotations

import multiprocessing
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmq_dagster.bench.common import Report
from kmq_dagster.bench.parallel_runs import Drain, awaiting, filled_queue, timed_drain
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings

SAMPLE_EVERY_S = 1.0
PARTITIONS = 2


@dataclass(frozen=True)
class DrainOrder:
    """What the spawned worker process is to drain (pickled to it)."""

    settings: KmqSettings
    topic: str
    group: str
    messages: int
    concurrency: int


#: What the worker process sends back: its drain, RSS samples, peak and idle RSS.
DrainReport = tuple[Drain, list[tuple[float, float]], float, float]


@dataclass(frozen=True)
class RssFigures:
    messages: int
    drain: Drain
    #: (seconds since the first call, RSS in MB), one a second while the backlog drained.
    samples: list[tuple[float, float]]
    #: The kernel's high-water mark of the worker process's RSS (``VmHWM``) at its end.
    hwm_mb: float
    #: RSS once imports are done, before the worker was built.
    idle_mb: float

    @property
    def peak_mb(self) -> float:
        """The worker's peak RSS: ``VmHWM``, or a sample above it. The kernel raises its
        high-water mark when pages are unmapped, not when it reclaims them under memory
        pressure, so on a loaded machine a sample can exceed it (73.7 MB against 73.5)."""
        return max(self.hwm_mb, *(mb for _, mb in self.samples))

    @property
    def start_mb(self) -> float:
        return self.samples[0][1]

    @property
    def end_mb(self) -> float:
        return self.samples[-1][1]

    @property
    def second_half_slope_mb_per_min(self) -> float:
        """Least-squares slope of the samples of the drain's second half."""
        half = self.samples[-1][0] / 2
        late = [(t, mb) for t, mb in self.samples if t >= half]
        if len(late) < 2:
            return 0.0
        slope, _ = statistics.linear_regression([t for t, _ in late], [mb for _, mb in late])
        return slope * 60

    def as_dict(self) -> dict[str, Any]:
        return {
            "rss_backlog": self.messages,
            "rss_handled": min(self.drain.handled, self.drain.acked),
            "rss_idle_mb": round(self.idle_mb, 1),
            "rss_start_mb": round(self.start_mb, 1),
            "rss_peak_mb": round(self.peak_mb, 1),
            "rss_end_mb": round(self.end_mb, 1),
            "rss_slope_mb_per_min": round(self.second_half_slope_mb_per_min, 2),
            "rss_drain_msgs_per_s": round(self.drain.msgs_per_s),
            "rss_samples_mb": [round(mb, 1) for _, mb in self.samples],
        }


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory in MB (``VmHWM``: its peak so far)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def drain_with_rss(
    settings: KmqSettings, messages: int, report: Report, *, concurrency: int = 1_000
) -> RssFigures:
    """Fill a queue with ``messages``, drain it in a spawned worker process, return its RSS."""
    opened = filled_queue(settings, messages, keys=100, partitions=PARTITIONS)
    report(f"rss: {messages:,} messages waiting; draining them at concurrency {concurrency}")
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[DrainReport] = context.Queue()
    order = DrainOrder(settings, opened.queue.topic, opened.queue.group, messages, concurrency)
    worker = context.Process(target=_drain_here, args=(order, results), daemon=True)
    worker.start()
    try:
        # 20 ms calls, 1,000 at once: 50,000 a second at best; a slow machine gets 20 times that.
        drain, samples, peak, idle = results.get(timeout=max(600.0, messages / 2_500))
    except queue.Empty:
        raise KmqTimeoutError(f"rss: the worker did not drain {messages:,} messages") from None
    finally:
        worker.join(60)
        if worker.is_alive():
            worker.kill()
    if not samples:  # drained within a second: the one sample there is
        samples = [(drain.seconds, peak)]
    return RssFigures(messages, drain, samples, hwm_mb=peak, idle_mb=idle)


def _twenty_ms(_index: int) -> float:
    return 0.02


def _drain_here(order: DrainOrder, results: multiprocessing.Queue[DrainReport]) -> None:
    """In the spawned worker process: drain the queue while a thread samples RSS."""
    idle = rss_mb()
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_EVERY_S):
            samples.append((time.perf_counter(), rss_mb()))

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    drain = timed_drain(
        open_queue(order.settings, order.topic, order.group),
        order.messages,
        lambda calls: awaiting(calls, _twenty_ms),
        concurrency=order.concurrency,
        ordering=Ordering.UNORDERED,
    )
    done.set()
    sampler.join()
    during = [
        (t - drain.started_at_s, mb)
        for t, mb in samples
        if drain.started_at_s <= t <= drain.ended_at_s
    ]
    results.put((drain, during, rss_mb("VmHWM"), idle))
