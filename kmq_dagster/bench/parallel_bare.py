"""Python alone on ``kmq bench parallel``'s waits: no Kafka, no kmq.

The same seeded waits as the worker's runs, through bare threads (``time.sleep`` on
``concurrency`` threads fed by a queue) and through a bare event loop (``asyncio.sleep`` in
``concurrency`` coroutines fed the same way); in key order each key's waits run one after
the other, as the worker's key order runs them. What these take is what the interpreter
itself costs for the shape on this machine, so the worker's figures can be read against it:
the worker cannot be faster than Python running the same waits with nothing else to do.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence

from kmq_dagster.worker.event_loops import new_event_loop


def lanes_of(count: int, keys: int, keyed: bool) -> list[list[int]]:
    """Message indices in the runs they must keep: one per key (message ``i`` has key
    ``i % keys``, as the filled queue has it), or one per message."""
    if keyed:
        return [list(range(key, count, keys)) for key in range(keys)]
    return [[index] for index in range(count)]


def bare_threads_s(waits_s: Sequence[float], keys: int, concurrency: int, keyed: bool) -> float:
    """Seconds for ``concurrency`` threads to sleep through every wait (each lane in turn)."""
    lanes: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    for lane in lanes_of(len(waits_s), keys, keyed):
        lanes.put(lane)

    def serve() -> None:
        while True:
            try:
                lane = lanes.get_nowait()
            except queue.Empty:
                return
            for index in lane:
                time.sleep(waits_s[index])

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def bare_asyncio_s(waits_s: Sequence[float], keys: int, concurrency: int, keyed: bool) -> float:
    """Seconds for one event loop (the worker's kind: uvloop's where installed) to await every
    wait, ``concurrency`` at a time: ``concurrency`` coroutines each take the next lane and
    await its waits in turn, as the threads do.

    Before stop 65 this made a coroutine per lane up front and let a semaphore of
    ``concurrency`` admit them, on asyncio's own loop: the I/O run's awaits ran at 18-24k/s
    there, slower than the worker (and so no floor), against 46-48k/s now."""

    async def run() -> None:
        lanes = iter(lanes_of(len(waits_s), keys, keyed))

        async def serve() -> None:
            for lane in lanes:  # shared: each coroutine takes the next lane when it is free
                for index in lane:
                    await asyncio.sleep(waits_s[index])

        await asyncio.gather(*(serve() for _ in range(concurrency)))

    loop = new_event_loop()
    started = time.perf_counter()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    return time.perf_counter() - started
