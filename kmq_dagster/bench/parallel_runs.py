"""One timed drain of a filled queue through the real :class:`Worker`, for ``kmq bench parallel``.

A run fills a fresh queue with ``messages`` messages (value: the message's index; key: one of
``keys``), starts a ``Worker`` with the handler and settings asked for, and times it from the
first handler call's start to the moment the worker loop has acknowledged the last message
(``ack()`` called for every message; its end markers follow within the flusher's 50 ms). The
group join, which the embedded broker makes last about half the session timeout, is before the
first call and so is never timed; nor are the worker's drain and group leave after the last ack.

Every handler notes which messages returned, so a run reports how many distinct messages were
handled as well as the worker's own count: a benchmark that lost messages must show it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue import Queue
from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.delivery import produce
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.worker import Worker, WorkerStats

#: A handler as the bench builds them (kept here: the worker's alias is not part of its API).
Handler = Callable[[KmqMessage], object]
GROUP = "bench-parallel"
#: A run that acknowledged nothing for this long (group join included) stops and reports
#: what it handled: a message the worker lost would otherwise keep it waiting for ever (no
#: tracker runs here to redeliver it).
STALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Drain:
    """What one timed run measured."""

    seconds: float
    #: Distinct messages whose handler call returned.
    handled: int
    #: Messages the worker acknowledged (its ``stats.handled``).
    acked: int
    #: CPU seconds of the whole process (every thread, librdkafka's too) while timed.
    cpu_s: float
    #: ``time.perf_counter()`` at the first call's start and at the last ack.
    started_at_s: float = 0.0
    ended_at_s: float = 0.0
    #: End markers the worker's consumer wrote (one per run of offsets acknowledged together).
    end_markers: int = 0

    @property
    def msgs_per_s(self) -> float:
        return self.acked / self.seconds if self.seconds > 0 else 0.0


class CallLog:
    """What handler calls note: when the first one started, which messages returned."""

    def __init__(self, messages: int) -> None:
        self.first_started_s = 0.0
        self.first_cpu_s = 0.0
        #: Calls that returned per message index (a duplicate delivery counts twice).
        self.returned = bytearray(messages)

    def started(self) -> None:
        if not self.first_started_s:
            self.first_cpu_s = time.process_time()
            self.first_started_s = time.perf_counter()

    def done(self, message: KmqMessage) -> None:
        self.returned[int(message.value or b"0")] = 1

    @property
    def handled(self) -> int:
        return len(self.returned) - self.returned.count(0)


class DirectCall(HandlerCall):
    """The handler called as the worker called it before issue 25: its result is not looked
    at (no await of a coroutine, no generator check). Only for the no-regression comparison."""

    def __call__(self, message: object, attributes: object = None) -> object:
        return self.handler(message)

    def hot_call(self) -> tuple[Handler, Callable[[object], object]]:
        # The straight path at N = 1 calls what this returns: the handler, its result ignored.
        return self.handler, _ignored


def _ignored(result: object) -> object:
    return result


def no_op(calls: CallLog) -> Handler:
    """Notes the call, nothing else; the same lines as ``kmq bench ack``'s plain consumer's
    handler (which reads ``record.value()`` where this reads the view's ``value``), so the two
    are compared on equal work."""

    def handle(message: KmqMessage) -> None:
        calls.started()
        calls.returned[int(message.value or b"0")] = 1

    return handle


def async_no_op(calls: CallLog) -> Handler:
    """:func:`no_op` as an ``async def`` handler: it awaits nothing."""

    async def handle(message: KmqMessage) -> None:
        calls.started()
        calls.returned[int(message.value or b"0")] = 1

    return handle


def sleeping(calls: CallLog, wait_s: Callable[[int], float]) -> Handler:
    """A sync handler sleeping ``wait_s(index)`` (an I/O wait that releases the GIL)."""

    def handle(message: KmqMessage) -> None:
        calls.started()
        time.sleep(wait_s(int(message.value or b"0")))
        calls.done(message)

    return handle


def awaiting(calls: CallLog, wait_s: Callable[[int], float]) -> Handler:
    """An ``async def`` handler awaiting ``asyncio.sleep(wait_s(index))``."""

    async def handle(message: KmqMessage) -> None:
        calls.started()
        await asyncio.sleep(wait_s(int(message.value or b"0")))
        calls.done(message)

    return handle


def filled_queue(settings: KmqSettings, messages: int, keys: int, partitions: int) -> OpenedQueue:
    """A fresh queue holding ``messages`` messages; key ``k`` always on partition ``k % p``."""
    queue = Queue(f"bench-parallel-{uuid.uuid4().hex[:8]}", GROUP, partitions=partitions)
    opened = provision_queue(settings, queue, delay_queue=False).opened
    producer = new_producer(settings, **{"linger.ms": 20})
    for index in range(messages):
        key = index % keys
        produce(
            producer,
            queue.topic,
            key=str(key).encode(),
            value=str(index).encode(),
            partition=key % partitions,
        )
    producer.flush(120)
    return opened


def timed_drain(
    opened: OpenedQueue,
    messages: int,
    make_handler: Callable[[CallLog], Handler],
    *,
    concurrency: int = 1,
    ordering: Ordering = Ordering.UNORDERED,
    direct_call: bool = False,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> Drain:
    """Drain ``opened`` (holding ``messages`` messages) through a ``Worker`` and time it.

    With ``direct_call`` (``concurrency`` 1 only) the worker calls the handler the way it did
    before async handlers were supported (:class:`DirectCall`).
    """
    calls = CallLog(messages)
    handler = make_handler(calls)
    worker = Worker(opened, handler, concurrency=concurrency, ordering=ordering)
    if direct_call:
        worker.handler = DirectCall(handler)
    stop = threading.Event()
    progress = [0, time.monotonic()]  # acknowledged so far, and since when
    ended = [0.0, 0.0]

    def on_batch(stats: WorkerStats) -> None:
        if stats.handled >= messages and not ended[0]:
            ended[:] = [time.perf_counter(), time.process_time()]
            stop.set()
        elif stats.handled != progress[0]:
            progress[:] = [stats.handled, time.monotonic()]
        elif time.monotonic() - progress[1] > stall_timeout_s:
            stop.set()

    stats = worker.run(stop, on_batch)
    if not ended[0]:  # stalled: the time so far, and the counts say what is missing
        ended[:] = [time.perf_counter(), time.process_time()]
    started_at_s = calls.first_started_s or ended[0]
    return Drain(
        seconds=ended[0] - started_at_s,
        handled=calls.handled,
        acked=stats.handled,
        cpu_s=ended[1] - calls.first_cpu_s,
        started_at_s=started_at_s,
        ended_at_s=ended[0],
        end_markers=worker.consumer.stats.end_markers,
    )
