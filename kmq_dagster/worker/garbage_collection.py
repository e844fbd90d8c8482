"""Fewer garbage collections while workers run.

CPython collects its youngest generation whenever the container objects allocated since the
last collection outnumber those freed by 700. Calls in flight keep many short-lived objects
alive at once (a coroutine, a future and a timer per awaiting call, an end per call), so with
that default the collector ran every few hundred messages and walked each call's objects
through two generations before reference counting freed them anyway: about a sixth of the CPU
of ``kmq bench parallel``'s I/O run (1,000 calls awaiting 20 ms), 700 young and 65 middle
collections per 100,000 messages (docs/benchmarks.md, stop 64).

While a worker runs, :func:`fewer_collections` raises that first threshold to
:data:`GC_FIRST_THRESHOLD` unless it is higher already, and the last worker of the process to
stop puts back the value it found (unless someone changed it meanwhile). Reference counting
frees what it freed before; only garbage in reference cycles waits longer to be collected.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The collector's first threshold while a worker runs (CPython's default is 700): above
#: the young objects a fetch's calls keep alive at once, so a steady stream of calls that
#: end rarely triggers a collection.
GC_FIRST_THRESHOLD = 10_000


class _RaisedThreshold:
    """The first threshold raised by the workers running in this process (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Workers running with a threshold of their own.
        self._running = 0
        #: The first threshold found when the first of them started.
        self._found = 0
        #: The first threshold they set last, or ``None`` if they set none.
        self._set: int | None = None

    def raise_to(self, first_threshold: int) -> None:
        with self._lock:
            current, *older = gc.get_threshold()
            if self._running == 0:
                self._found, self._set = current, None
            self._running += 1
            if current < first_threshold:
                gc.set_threshold(first_threshold, *older)
                self._set = first_threshold

    def put_back(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running:
                return
            current, *older = gc.get_threshold()
            if self._set is not None and current == self._set:
                gc.set_threshold(self._found, *older)
            self._set = None


_RAISED = _RaisedThreshold()


@contextmanager
def fewer_collections(first_threshold: int | None = GC_FIRST_THRESHOLD) -> Iterator[None]:
    """Run the block with the collector's first threshold at least ``first_threshold``
    (``None``: leave the collector alone)."""
    if first_threshold is None:
        yield
        return
    _RAISED.raise_to(first_threshold)
    try:
        yield
    finally:
        _RAISED.put_back()
