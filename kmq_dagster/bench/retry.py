"""``kmq bench retry``: how close to their due time delayed and retried messages are processed.

One queue, one worker (consumer, retry router, handler) and one delay forwarder, on one broker:

Both kinds are sent at a steady rate for ``send_seconds``:

* delayed messages: ``send(..., delay=d)`` with ``d`` drawn from 1 s to ``max_delay_ms`` (45 s:
  levels 1s, 5s and 30s of the ladder, and the in-memory last stretch);
* retried messages: produced to the queue, failing once (then due 1 s later) or twice (then
  5 s more), so they travel the group's retry topics.

The handler notes, for every delivery that carries a due time, how late it runs: its wall
clock minus the due time. Negative is early, which must never happen.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer

from kmq_dagster.bench.common import Cluster, Report, percentile
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.retry_headers import read_attempt, read_due_ms
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.delay_forwarder import DelayForwarder
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker

GROUP = "bench"
PARTITIONS = 2
RETRY_DELAYS_MS = (1_000, 5_000)
MIN_DELAY_MS = 1_000
DEFAULT_MAX_DELAY_MS = 45_000
#: Sends are spread evenly over this long by default: the benchmark measures due-time precision,
#: not how long a worker takes to drain a backlog it cannot keep up with (0: one burst).
SEND_SECONDS = 20.0
WARM_UP = b"warm-up"


class BenchFailure(RuntimeError):
    """The failure retried messages raise on purpose."""


@dataclass
class Lateness:
    """Milliseconds past the due time, per path."""

    delayed: list[float] = field(default_factory=list)
    retried: list[float] = field(default_factory=list)

    def total(self) -> int:
        return len(self.delayed) + len(self.retried)


@dataclass
class RetryFigures:
    lateness: Lateness
    delayed_messages: int
    retried_messages: int

    def as_json(self) -> str:
        every = self.lateness.delayed + self.lateness.retried
        figures = {
            "early": sum(1 for ms in every if ms < 0),
            "lateness_p50_ms": round(percentile(every, 0.5), 1),
            "lateness_p99_ms": round(percentile(every, 0.99), 1),
            "lateness_max_ms": round(max(every), 1),
            "deliveries": len(every),
            "delayed_messages": self.delayed_messages,
            "retried_messages": self.retried_messages,
            "delay_lateness_p99_ms": round(percentile(self.lateness.delayed, 0.99), 1),
            "retry_lateness_p99_ms": round(percentile(self.lateness.retried, 0.99), 1),
        }
        return json.dumps(figures)


def _handler(lateness: Lateness, warmed: threading.Event) -> Callable[[KmqMessage], None]:
    lock = threading.Lock()

    def handle(message: KmqMessage) -> None:
        now_ms = wall_clock_ms()
        value = message.value or b""
        if value == WARM_UP:
            warmed.set()
            return
        due_ms = read_due_ms(message.headers)
        if value.startswith(b"r"):  # b"r<failures>-<n>": fail that many attempts
            if due_ms is not None:
                with lock:
                    lateness.retried.append(now_ms - due_ms)
            if read_attempt(message.headers) <= int(value[1:2]):
                raise BenchFailure("failing on purpose")
        elif due_ms is not None:
            with lock:
                lateness.delayed.append(now_ms - due_ms)

    return handle


def run_retry_benchmark(
    cluster: Cluster,
    messages: int,
    report: Report,
    *,
    send_seconds: float = SEND_SECONDS,
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
) -> RetryFigures:
    """Send ``messages`` delayed and ``messages`` failing messages; measure every due delivery."""
    rng = random.Random(7)
    lateness = Lateness()
    warmed = threading.Event()
    with cluster() as settings:
        queue = Queue(
            f"bench-retry-{uuid.uuid4().hex[:8]}",
            GROUP,
            partitions=PARTITIONS,
            retry_policy=RetryPolicy.fixed(RETRY_DELAYS_MS),
        )
        topic = queue.topic
        opened = provision_queue(settings, queue, delay_queue=True).opened
        worker = Worker(opened, _handler(lateness, warmed))
        forwarder = DelayForwarder(settings, topic)
        stop = threading.Event()
        threads = [
            threading.Thread(target=forwarder.run, args=(stop,), daemon=True),
            threading.Thread(target=worker.run, args=(stop,), daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            _warm_up(settings, topic, forwarder, warmed)
            expected = _send(
                settings,
                topic,
                messages,
                send_seconds=send_seconds,
                max_delay_ms=max_delay_ms,
                rng=rng,
                report=report,
            )
            _wait(lateness, expected, report)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
    return RetryFigures(lateness, messages, messages)


def _warm_up(
    settings: KmqSettings, topic: str, forwarder: DelayForwarder, warmed: threading.Event
) -> None:
    """Wait until the worker and the forwarder have joined their groups."""
    deadline = time.monotonic() + 120
    while not forwarder.assignment_ready():
        if time.monotonic() > deadline:
            raise KmqTimeoutError("the delay forwarder got no partitions in 120 s")
        time.sleep(0.1)
    producer = Producer(settings.producer_config())
    producer.produce(topic, value=WARM_UP)
    producer.flush(30)
    if not warmed.wait(120):
        raise KmqTimeoutError("the worker handled nothing in 120 s")


def _send(
    settings: KmqSettings,
    topic: str,
    messages: int,
    *,
    send_seconds: float,
    max_delay_ms: int,
    rng: random.Random,
    report: Report,
) -> int:
    """Send both kinds of message, interleaved; returns how many due deliveries to expect."""
    producer = KmqProducer(settings)
    expected = 0
    started = time.monotonic()
    for n in range(messages):
        ahead_s = started + n * send_seconds / messages - time.monotonic()
        if ahead_s > 0:
            producer.flush(ahead_s)
        delay_s = rng.randint(MIN_DELAY_MS, max_delay_ms) / 1000
        _send_one(producer, topic, f"d-{n}", delay_s)
        failures = 1 + (n % 3 == 0)  # a third fail twice: one hop on each retry topic
        _send_one(producer, topic, f"r{failures}-{n}", None)
        expected += 1 + failures
    producer.flush(120)
    low_s, high_s = MIN_DELAY_MS / 1000, max_delay_ms / 1000
    report(
        f"sent over {send_seconds:g} s: {messages:,} delayed messages "
        f"(delays {low_s:g}-{high_s:g} s) and {messages:,} failing ones "
        f"(retries after {', '.join(f'{ms // 1000} s' for ms in RETRY_DELAYS_MS)})"
    )
    return expected


def _send_one(producer: KmqProducer, topic: str, value: str, delay_s: float | None) -> None:
    while True:
        try:
            producer.send(topic, value, delay=delay_s)
            return
        except BufferError:
            producer.flush(0.05)


def _wait(lateness: Lateness, expected: int, report: Report) -> None:
    """Wait for every due delivery, reporting progress; give up after 5 idle minutes."""
    last_count, last_change = -1, time.monotonic()
    while lateness.total() < expected:
        time.sleep(5)
        count = lateness.total()
        report(f"{count:,} of {expected:,} due deliveries processed")
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > 300:
            raise KmqTimeoutError(f"stuck at {count:,} of {expected:,} due deliveries")
