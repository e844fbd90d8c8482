"""Functions for the Spark concurrency tests: they record on the executors, into a file the
test reads, how many of their calls ran at once and whether two calls of one key overlapped.

Each is a callable object: Spark pickles it once per task, so its counters are the task's
(a task processes one partition number); the file is appended to by every task's process.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kmq_dagster.spark.message import SparkMessage
from tests.support.line_files import append_line

#: Guards the counters of the calls a thread pool runs (one lock per executor process).
_LOCK = threading.Lock()


@dataclass
class AwaitingEcho:
    """``async``: awaits ``wait_s`` (I/O), returns the value upper-cased; notes each new peak
    of its task's calls in flight as a line ``peak <n>``."""

    path: str
    wait_s: float = 0.05
    in_flight: int = field(default=0, init=False)
    peak: int = field(default=0, init=False)

    async def __call__(self, message: SparkMessage) -> str:
        self.in_flight += 1  # one event loop per task: no lock needed
        if self.in_flight > self.peak:
            self.peak = self.in_flight
            append_line(self.path, f"peak {self.peak}")
        try:
            await asyncio.sleep(self.wait_s)
        finally:
            self.in_flight -= 1
        return (message.value or b"").decode().upper()


@dataclass
class KeyOverlapChecker:
    """Sync (runs on the task's thread pool): notes every call as ``start <key> <offset>``,
    a call of a key whose earlier call is still running as ``overlap <key> <offset>``, and each
    new peak of calls in flight as ``peak <n>``."""

    path: str
    wait_s: float = 0.002
    running: dict[bytes | None, int] = field(default_factory=dict, init=False)
    in_flight: int = field(default=0, init=False)
    peak: int = field(default=0, init=False)

    def __call__(self, message: SparkMessage) -> str:
        key = message.key
        with _LOCK:
            if self.running.get(key, 0):
                append_line(self.path, f"overlap {key!r} {message.offset}")
            self.running[key] = self.running.get(key, 0) + 1
            self.in_flight += 1
            if self.in_flight > self.peak:
                self.peak = self.in_flight
                append_line(self.path, f"peak {self.peak}")
            append_line(self.path, f"start {(key or b'').decode()} {message.offset}")
        try:
            time.sleep(self.wait_s)  # the I/O: other keys' calls run meanwhile
        finally:
            with _LOCK:
                self.running[key] -= 1
                self.in_flight -= 1
        return (message.value or b"").decode()


def read_lines(path: Path) -> list[list[str]]:
    """The recorded lines, split in words."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def awaiting_price(message: SparkMessage) -> object:
    """The demo's pricing behind 5 ms of awaited I/O."""
    from kmq_dagster.demo.orders import price_order

    await asyncio.sleep(0.005)
    return price_order(message)


#: For ``kmq spark --function tests.support.spark_concurrency:awaiting_upper``: notes its peaks
#: in ``$KMQ_TEST_CALLS_FILE`` (the command's environment reaches its Python workers).
_ECHO = AwaitingEcho(os.environ.get("KMQ_TEST_CALLS_FILE", os.devnull), wait_s=0.01)


async def awaiting_upper(message: SparkMessage) -> str:
    """:class:`AwaitingEcho` with 10 ms of awaited I/O, as a module-level function."""
    return await _ECHO(message)


async def awaiting_picky(message: SparkMessage) -> str:
    """Awaits 5 ms, then fails every message whose index (value ``m<index>``) is a multiple of
    ten with a ``ValueError``."""
    await asyncio.sleep(0.005)
    index = int((message.value or b"m-1")[1:])
    if index % 10 == 0:
        raise ValueError(f"{index} is not allowed")
    return str(index)


async def _upper_later(value: bytes) -> str:
    await asyncio.sleep(0)
    return value.decode().upper()


def deferred_upper(message: SparkMessage) -> object:
    """A plain function (not ``async def``, not a generator function) whose work is deferred:
    a coroutine giving the value upper-cased, or, for a value ending in ``7``, a generator
    (whose body, a failure, runs only if iterated)."""
    value = message.value or b""
    if value.endswith(b"7"):
        return (ValueError(value) for _ in [1])
    return _upper_later(value)
