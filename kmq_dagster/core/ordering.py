"""Ordering under concurrency (invariant 10): which fetched messages may start now.

Kept apart from how calls run: a worker adds what it fetched, takes what may start and reports
each call's end. Messages queue in *lanes*; a lane runs one message at a time in the order
added, and one retried in place stays at its lane's head, so later ones never overtake it.
A worker may take a lane's whole queue as one *run* (:meth:`LaneScheduler.take_runs`), to call
on one thread in turn: its calls still end one at a time, in order, and what the thread did not
start comes back to the lane's head (:meth:`LaneScheduler.give_back`). Messages added to a
lane while its run is in flight may join that run (:meth:`LaneScheduler.grown_runs`,
:meth:`LaneScheduler.extend_run`), so its thread goes on without waiting for the worker.
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

#: Below every offset: the last offset added from a source not seen since it was forgotten.
_BELOW_ANY = float("-inf")


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

    __slots__ = ("busy", "head", "lane_id", "rest", "retry_seq", "run", "run_handle")

    def __init__(self, lane_id: tuple[Source, bytes | int | None], head: T) -> None:
        self.lane_id = lane_id
        self.head = head
        self.rest: deque[T] | None = None
        #: Taken with the head as one run, after it: in flight, to start once it ends.
        self.run: deque[T] | None = None
        #: The head is in flight.
        self.busy = False
        #: The head waits for this retry heap entry (-1: none); other entries are stale.
        self.retry_seq = -1
        #: The caller's handle of the run in flight (see :meth:`LaneScheduler.tag_run`):
        #: messages added meanwhile may join it.
        self.run_handle: object = None


class LaneScheduler(Generic[T]):
    """Buffered messages in lanes, at most ``max_in_flight`` lanes busy: that many calls at
    once, as each lane runs one message at a time (a run's later messages wait for its head).

    Items are the caller's message handles, hashable, each added once. Every item ends finished
    (:meth:`finish`), forgotten (returned by :meth:`forget`), or is still here: none is dropped.
    """

    def __init__(self, ordering: Ordering, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.ordering = Ordering(ordering)
        # Read for every message added: plain flags, not enum comparisons.
        self._by_partition = self.ordering is Ordering.PARTITION
        self._by_key = self.ordering is Ordering.KEY
        self.max_in_flight = max_in_flight
        self._lanes: dict[tuple[Source, bytes | int | None], _Lane[T]] = {}
        self._lane_of: dict[T, _Lane[T]] = {}
        self._in_flight: set[T] = set()
        #: Lanes whose head is in flight.
        self._busy = 0
        #: Lanes whose head may start now, oldest first; each lane at most once.
        self._ready: deque[_Lane[T]] = deque()
        #: (due_ms, seq, lane) of heads retried in place; stale entries are skipped.
        self._retries: list[tuple[int, int, _Lane[T]]] = []
        self._seq = itertools.count()
        self._last_offset: dict[Source, int] = {}
        #: Lanes with a tagged run in flight that were added to since :meth:`grown_runs`.
        self._grown: dict[_Lane[T], None] = {}

    @property
    def in_flight(self) -> int:
        """Messages taken and neither finished nor retried in place."""
        return len(self._in_flight)

    @property
    def busy_lanes(self) -> int:
        """Lanes with a message in flight: the calls that may be running now."""
        return self._busy

    @property
    def holding(self) -> int:
        """Every message here: waiting, in flight, or waiting for its retry in place."""
        return len(self._lane_of)

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
        lane_of = self._lane_of
        if item in lane_of:
            raise ValueError(f"{item!r} was already added")
        last = self._last_offset.get(source, _BELOW_ANY)
        if offset <= last:
            raise ValueError(f"offset {offset} of {source} is not above the last one, {last}")
        self._last_offset[source] = offset
        lane_id: tuple[Source, bytes | int | None]
        if self._by_partition:
            lane_id = (source, None)
        elif self._by_key and key is not None:
            lane_id = (source, key)
        else:
            # A lane of its own; a redelivered duplicate of a message still in flight (same
            # offset after a forget) waits for it rather than running beside it.
            lane_id = (source, offset)
        lanes = self._lanes
        lane = lanes.get(lane_id)
        if lane is None:
            lane = lanes[lane_id] = _Lane(lane_id, item)
            self._ready.append(lane)
        elif lane.rest is None:
            lane.rest = deque((item,))
        else:
            lane.rest.append(item)
        if lane.run_handle is not None:
            self._grown[lane] = None
        lane_of[item] = lane

    def take(self, now_ms: int, limit: int | None = None) -> list[T]:
        """The messages that may start now (they are then in flight): heads of idle lanes,
        retried heads first once due, never more than ``max_in_flight`` lanes busy, and at
        most ``limit`` of them."""
        return [lane.head for lane in self._start_lanes(now_ms, limit)]

    def take_runs(self, now_ms: int) -> list[list[T]]:
        """Like :meth:`take`, but each lane that may start gives its whole queue, head first,
        as one run: all of it in flight, its lane busy until the run's last message ends.

        The caller calls a run's messages in turn and reports their ends in that order; the
        ones it did not start (it stopped at a failure, or the worker stops) come back with
        :meth:`give_back` before the end of the failed one is reported."""
        runs: list[list[T]] = []
        in_flight = self._in_flight
        for lane in self._start_lanes(now_ms, None):
            rest = lane.rest
            if rest:
                lane.rest, lane.run = None, rest
                in_flight.update(rest)
                runs.append([lane.head, *rest])
            else:
                runs.append([lane.head])
        return runs

    def tag_run(self, item: T, handle: object) -> None:
        """Name the run ``item`` heads (just taken from :meth:`take_runs`) by the caller's
        ``handle``: messages added to its lane while it is in flight are then offered to it
        by :meth:`grown_runs`, so its thread can go on without a round trip through the
        caller. The tag ends with the run (its last message finished or given back)."""
        self._lane_of[item].run_handle = handle

    def grown_runs(self) -> list[tuple[object, list[T]]]:
        """``(handle, waiting)`` for each tagged run whose lane was added to since the last
        call: the messages waiting behind it, in order. Nothing changes here; those the
        caller's run takes on are passed to :meth:`extend_run`."""
        grown, self._grown = self._grown, {}
        return [
            (lane.run_handle, list(lane.rest))
            for lane in grown
            if lane.run_handle is not None and lane.rest
        ]

    def extend_run(self, items: list[T]) -> None:
        """The first waiting messages of a tagged run's lane, ``items``, joined that run: in
        flight now, started by its thread in turn after the run's others."""
        lane = self._lane_of[items[0]]
        rest = lane.rest
        if lane.run_handle is None or not rest:
            raise ValueError(f"{items!r} cannot join a run in flight")
        if list(itertools.islice(rest, len(items))) != items:
            raise ValueError(f"{items!r} are not the next messages waiting in their lane")
        for _ in items:
            rest.popleft()
        if not rest:
            lane.rest = None
        if lane.run is None:
            lane.run = deque(items)
        else:
            lane.run.extend(items)
        self._in_flight.update(items)

    def _start_lanes(self, now_ms: int, limit: int | None) -> list[_Lane[T]]:
        due: list[_Lane[T]] = []
        while self._retries and self._retries[0][0] <= now_ms:
            _, seq, lane = heapq.heappop(self._retries)
            if lane.retry_seq == seq:
                lane.retry_seq = -1
                due.append(lane)
        self._ready.extendleft(reversed(due))  # the oldest waits least
        room = self.max_in_flight - self._busy
        if limit is not None:
            room = min(room, limit)
        started: list[_Lane[T]] = []
        ready, in_flight = self._ready, self._in_flight
        while room > 0 and ready:
            lane = ready.popleft()
            lane.busy = True
            in_flight.add(lane.head)
            started.append(lane)
            room -= 1
        self._busy += len(started)
        return started

    def finish(self, item: T) -> None:
        """``item``'s call is over (acknowledged, or handed to a retry topic or the DLQ):
        the next message of its lane may start."""
        # What _take_back does, inline: this runs once for every message.
        in_flight, lane_of = self._in_flight, self._lane_of
        if item not in in_flight:
            raise ValueError(f"{item!r} is not in flight")
        lane = lane_of[item]
        run = lane.run
        if run and lane.head != item:
            raise ValueError(f"{item!r} ended before {lane.head!r}, which its run started first")
        in_flight.remove(item)
        del lane_of[item]
        if run:  # the run's next message, already in flight, is the head now: still busy
            lane.head = run.popleft()
            if not run:
                lane.run = None
            return
        lane.busy = False
        lane.run_handle = None
        self._busy -= 1
        if lane.rest:
            lane.head = lane.rest.popleft()
            self._ready.append(lane)
        else:
            del self._lanes[lane.lane_id]

    def retry_in_place(self, item: T, due_ms: int) -> None:
        """``item`` failed and runs again, ahead of the rest of its lane, from ``due_ms`` on
        (never earlier: invariant 4); its lane waits for it."""
        if item in self._lane_of and self._lane_of[item].run:
            raise ValueError(f"the rest of {item!r}'s run must be given back first")
        lane = self._take_back(item)
        lane.retry_seq = next(self._seq)
        heapq.heappush(self._retries, (due_ms, lane.retry_seq, lane))

    def give_back(self, items: list[T], *, drop: bool = False) -> None:
        """The end of a run (from :meth:`take_runs`) that never started, in run order: back
        at the head of its lane, in that order, ahead of what came after; if the run's head
        is among them, the lane is idle again and its head may start first. With ``drop``
        they leave instead (their partition was fetched again: :meth:`in_flight_of`)."""
        if not items:
            return
        lane = self._lane_of[items[0]]
        head_back = lane.busy and lane.head == items[0]
        if items != [*((lane.head,) if head_back else ()), *(lane.run or ())]:
            raise ValueError(f"{items!r} is not the end of a run in flight")
        for item in items:
            self._in_flight.remove(item)
            if drop:
                del self._lane_of[item]
        lane.run = None
        lane.run_handle = None  # what the run's thread did not start: no more joins it
        back = items[1:] if head_back else items
        if head_back:  # the head never started: the lane waits no more
            lane.busy = False
            self._busy -= 1
        if drop:
            if not head_back:
                return
            if not lane.rest:
                del self._lanes[lane.lane_id]
                return
            lane.head = lane.rest.popleft()
        elif back:
            lane.rest = deque(back) if not lane.rest else deque((*back, *lane.rest))
        if head_back:
            self._ready.appendleft(lane)

    def in_flight_of(self, sources: Iterable[Source]) -> list[T]:
        """What is in flight of ``sources``' busy lanes, each lane's head and its run in
        order (a run's messages may not have started yet)."""
        wanted = set(sources)
        return [
            item
            for lane_id, lane in self._lanes.items()
            if lane.busy and lane_id[0] in wanted
            for item in (lane.head, *(lane.run or ()))
        ]

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
            lane.run_handle = None  # new copies of the source must not join its run
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
        lane = self._lane_of[item]
        if lane.run and lane.head != item:
            raise ValueError(f"{item!r} ended before {lane.head!r}, which its run started first")
        self._in_flight.remove(item)
        lane.busy = False
        lane.run_handle = None
        self._busy -= 1
        return lane
