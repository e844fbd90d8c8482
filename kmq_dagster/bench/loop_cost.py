"""``kmq bench loop``: the CPU a message costs in the worker loop itself.

The loop runs on an in-memory consumer that hands out ready batches and takes acks without any
I/O, so what is measured is the loop above the consumer (scheduling, the handler call, the ack
call, the stats), not the broker or the consumer's markers: ``kmq bench ack`` measures the whole
worker. Runs: ``n1`` (``Worker``'s default: concurrency 1, partition order), ``n100_sync`` and
``n100_async`` (concurrency 100, unordered, a sync or ``async def`` no-op handler). Rounds
alternate the runs; each figure is the median of its rounds.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue import Queue
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.opened_queue import vouch_for
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.loop import WorkerLoop

#: Messages per fetch the in-memory consumer hands out (the default ``batch_size``).
BATCH = 500
#: Longest one run may take before the benchmark gives up on it, in seconds.
STALL_S = 600.0
#: The runs: (concurrency, ordering, async handler).
RUNS: dict[str, tuple[int, Ordering, bool]] = {
    "n1": (1, Ordering.PARTITION, False),
    "n100_sync": (100, Ordering.UNORDERED, False),
    "n100_async": (100, Ordering.UNORDERED, True),
}


class _Record:
    """The parts of a confluent-kafka record a message view reads."""

    __slots__ = ("_offset",)

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "bench"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes | None:
        return b"v"

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class _InMemoryConsumer:
    """A :class:`~kmq_dagster.worker.loop_types.LoopConsumer` over prepared batches."""

    visibility_timeout_ms = 30_000
    #: Its records carry no headers and come from no retry topic, as a real consumer says of
    #: such a fetch.
    fetch_has_metadata = False

    def __init__(self, messages: int) -> None:
        records: list[Any] = [_Record(offset) for offset in range(messages)]
        views = [KmqMessage(record) for record in records]
        self._batches = [views[i : i + BATCH] for i in range(0, messages, BATCH)]
        self.acked = 0

    def poll(self, timeout_s: float = 0.0) -> list[KmqMessage]:
        return self._batches.pop(0) if self._batches else []

    def ack(self, message: KmqMessage) -> None:
        self.acked += 1

    def acknowledger(self) -> Callable[[KmqMessage], None]:
        return self.ack

    def nack(self, message: KmqMessage) -> None:
        raise AssertionError("a no-op handler never fails")

    def extend(self, message: KmqMessage, seconds: float) -> None:
        pass

    def hold_fetching(self, hold: bool) -> None:
        pass


class _NoCopies:
    """The router's producer: a no-op handler never fails, so nothing is ever copied."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a no-op handler never fails (producer.{name} called)")


def _no_op(_message: KmqMessage) -> None:
    return None


async def _async_no_op(_message: KmqMessage) -> None:
    return None


def loop_cpu_us_per_message(name: str, messages: int) -> float:
    """Process CPU per message, in us, of the loop of run ``name`` handling ``messages``."""
    concurrency, ordering, use_async = RUNS[name]
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000  # noqa: E731
    # Nothing is opened: no broker is involved, the queue is only the router's settings.
    opened = vouch_for(KmqSettings(), Queue("bench", "bench", partitions=1))
    router = RetryRouter(opened, clock_ms=clock_ms, producer=_NoCopies())  # type: ignore[arg-type]
    consumer = _InMemoryConsumer(messages)
    handler = HandlerCall(_async_no_op if use_async else _no_op)
    loop = WorkerLoop(
        consumer, handler, threading.Event(), router=router, breaker=None, clock_ms=clock_ms,
        concurrency=concurrency, ordering=ordering, max_buffered=BATCH,
    )  # fmt: skip
    started = time.process_time()
    deadline_s = time.monotonic() + STALL_S
    try:
        while consumer.acked < messages:
            loop.step()
            if time.monotonic() > deadline_s:
                raise RuntimeError(f"{name}: {consumer.acked} of {messages} acked in {STALL_S} s")
        return (time.process_time() - started) / messages * 1e6
    finally:
        loop.close()
        handler.close()


@dataclass
class LoopCosts:
    """CPU per message of each run, every round."""

    rounds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in RUNS})

    def median(self, name: str) -> float:
        return statistics.median(self.rounds[name])

    def table(self) -> list[str]:
        return [
            f"{name}: {self.median(name):.2f} us of CPU per message (median; rounds "
            + ", ".join(f"{us:.2f}" for us in self.rounds[name])
            + ")"
            for name in RUNS
        ]

    def as_json(self) -> str:
        return json.dumps(
            {f"loop_{name}_cpu_us_per_msg": round(self.median(name), 2) for name in RUNS}
        )


def run_loop_benchmark(messages: int, rounds: int, report: Callable[[str], None]) -> LoopCosts:
    """Every run ``rounds`` times, in an order that rotates from round to round."""
    costs = LoopCosts()
    names = list(RUNS)
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            costs.rounds[name].append(loop_cpu_us_per_message(name, messages))
            report(f"round {index + 1}/{rounds}: {name} {costs.rounds[name][-1]:.2f} us/msg")
    return costs
