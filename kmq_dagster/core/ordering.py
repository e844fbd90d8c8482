"""Ordering under concurrency (invariant 10): which fetched messages may start now.

Kept apart from how calls run: a worker adds what it fetched, takes what may start and reports
each call's end. Messages queue in *lanes*; a lane runs one message at a time in the order
added, and one retried in place stays at its lane's head, so later ones never overtake it.
What a lane is depends on the :class:`Ordering`:

* ``partition``: one lane per source ``(topic, partition)``;
* ``key``: one lane per key within its source (Kafka keys pick partitions, so a key is scoped
  to its partition); a message without a key is a lane of its own, i.e. unordered;
* ``unordered``: every message is a lane of its own.

A source is the topic partition a message was fetched from: a redelivered or retried copy
comes from another topic, so nothing here orders it against its original. Bounded memory
(invariant 11) is the caller's job: one hot key (or partition) can fill the buffer while other
lanes are empty, so the caller pauses fetching while :attr:`LaneScheduler.buffered` is at its
limit. Not thread-safe: one loop owns it. Time is ``now_ms`` passed in, never read here.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from kmq_dagster.core.ranges import Source

__all__ = ["LaneScheduler", "Ordering", "Source"]

T = TypeVar("T", bound=Hashable)


class Ordering(enum.StrEnum):
    """What a concurrent worker promises about the order messages start in."""

    #: One message at a time per ``(topic, partition)``, in offset order.
    PARTITION = "partition"
    #: Never two messages of one key at once; one key's messages start in offset order.
    KEY = "key"
    #: Nothing beyond the in-flight limit.
    UNORDERED = "unordered"


class _Lane(Generic[T]):
    """Messages that start one at a time, head first. A lane exists while it holds a message:
    its head, and the rest behind it (no deque until there is a second: in ``unordered``
    order every message is a lane of its own, and building a deque for each was a tenth of a
    concurrent worker's loop)."""

    __slots__ = ("busy", "head", "lane_id", "rest", "retry_seq")

    def __init__(self, lane_id: tuple[Source, bytes | int | None], head: T) -> None:
        self.lane_id = lane_id
        self.head = head
        self.rest: deque[T] | None = None
        #: The head is in flight.
        self.busy = False
        #: The head waits for this retry heap entry (-1: none); other entries are stale.
        self.retry_seq = -1


class LaneScheduler(Generic[T]):
    """Buffered messages in lanes, at most ``max_in_flight`` of them in flight.

    Items are the caller's message handles, hashable, each added once. Every item ends finished
    (:meth:`finish`), forgotten (returned by :meth:`forget`), or is still here: none is dropped.
    """

    def __init__(self, ordering: Ordering, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.ordering = Ordering(ordering)
        self.max_in_flight = max_in_flight
        self._lanes: dict[tuple[Source, bytes | int | None], _Lane[T]] = {}
        self._lane_of: dict[T, _Lane[T]] = {}
        self._in_flight: set[T] = set()
        #: Lanes whose head may start now, oldest first; each lane at most once.
        self._ready: deque[_Lane[T]] = deque()
        #: (due_ms, seq, lane) of heads retried in place; stale entries are skipped.
        self._retries: list[tuple[int, int, _Lane[T]]] = []
        self._seq = itertools.count()
        self._last_offset: dict[Source, int] = {}

    @property
    def in_flight(self) -> int:
        """Messages taken and neither finished nor retried in place."""
        return len(self._in_flight)

    @property
    def holds_any(self) -> bool:
        """Any message here at all: waiting, in flight, or waiting for its retry in place."""
        return bool(self._lane_of)

    @property
    def buffered(self) -> int:
        """Messages waiting to start, for whatever reason (what back-pressure counts)."""
        return len(self._lane_of) - len(self._in_flight)

    @property
    def held(self) -> int:
        """Waiting messages that could not start even with a free slot: their lane is busy,
        an earlier message of their lane goes first, or their retry was not due at the last
        :meth:`take`."""
        return self.buffered - len(self._ready)

    def add(self, item: T, source: Source, offset: int, key: bytes | None) -> None:
        """Buffer a fetched message at the tail of its lane.

        Raises:
            ValueError: ``item`` is already here, or ``offset`` is not above the last one
                added from ``source`` since it was last forgotten (lanes start in the order
                added, so a caller that seeks back must :meth:`forget` the source first).
        """
        if item in self._lane_of:
            raise ValueError(f"{item!r} was already added")
        last = self._last_offset.get(source)
        if last is not None and offset <= last:
            raise ValueError(f"offset {offset} of {source} is not above the last one, {last}")
        self._last_offset[source] = offset
        lane_id: tuple[Source, bytes | int | None]
        if self.ordering is Ordering.PARTITION:
            lane_id = (source, None)
        elif self.ordering is Ordering.KEY and key is not None:
            lane_id = (source, key)
        else:
            # A lane of its own; a redelivered duplicate of a message still in flight (same
            # offset after a forget) waits for it rather than running beside it.
            lane_id = (source, offset)
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = _Lane(lane_id, item)
            self._ready.append(lane)
        elif lane.rest is None:
            lane.rest = deque((item,))
        else:
            lane.rest.append(item)
        self._lane_of[item] = lane

    def take(self, now_ms: int, limit: int | None = None) -> list[T]:
        """The messages that may start now (they are then in flight): heads of idle lanes,
        retried heads first once due, never more than ``max_in_flight`` in flight in all,
        and at most ``limit`` of them."""
        due: list[_Lane[T]] = []
        while self._retries and self._retries[0][0] <= now_ms:
            _, seq, lane = heapq.heappop(self._retries)
            if lane.retry_seq == seq:
                lane.retry_seq = -1
                due.append(lane)
        self._ready.extendleft(reversed(due))  # the oldest waits least
        room = self.max_in_flight - len(self._in_flight)
        if limit is not None:
            room = min(room, limit)
        started: list[T] = []
        while room > 0 and self._ready:
            lane = self._ready.popleft()
            lane.busy = True
            head = lane.head
            self._in_flight.add(head)
            started.append(head)
            room -= 1
        return started

    def finish(self, item: T) -> None:
        """``item``'s call is over (acknowledged, or handed to a retry topic or the DLQ):
        the next message of its lane may start."""
        lane = self._take_back(item)
        del self._lane_of[item]
        if lane.rest:
            lane.head = lane.rest.popleft()
            self._ready.append(lane)
        else:
            del self._lanes[lane.lane_id]

    def retry_in_place(self, item: T, due_ms: int) -> None:
        """``item`` failed and runs again, ahead of the rest of its lane, from ``due_ms`` on
        (never earlier: invariant 4); its lane waits for it."""
        lane = self._take_back(item)
        lane.retry_seq = next(self._seq)
        heapq.heappush(self._retries, (due_ms, lane.retry_seq, lane))

    def next_due_ms(self) -> int | None:
        """When the earliest retry in place is due, for the caller's wait; ``None`` if none."""
        while self._retries and self._retries[0][2].retry_seq != self._retries[0][1]:
            heapq.heappop(self._retries)
        return self._retries[0][0] if self._retries else None

    def forget(self, sources: Iterable[Source]) -> list[T]:
        """Partitions were revoked: drop their waiting messages (retried heads included) and
        return them, in lane order, for the caller to leave for redelivery. Messages in
        flight stay until finished."""
        revoked = set(sources)
        dropped: list[T] = []
        for lane_id, lane in list(self._lanes.items()):
            if lane_id[0] not in revoked:
                continue
            if not lane.busy:  # the head waits too (a retried head included)
                dropped.append(lane.head)
                del self._lanes[lane_id]
            dropped.extend(lane.rest or ())
            lane.rest = None
            lane.retry_seq = -1
        for item in dropped:
            del self._lane_of[item]
        lanes = self._lanes
        self._ready = deque(lane for lane in self._ready if lanes.get(lane.lane_id) is lane)
        for source in revoked:
            self._last_offset.pop(source, None)
        return dropped

    def _take_back(self, item: T) -> _Lane[T]:
        if item not in self._in_flight:
            raise ValueError(f"{item!r} is not in flight")
        self._in_flight.remove(item)
        lane = self._lane_of[item]
        lane.busy = False
        return lane
