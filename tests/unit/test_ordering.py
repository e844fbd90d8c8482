"""Ordering under concurrency: which buffered messages may start now (invariant 10).

Items are plain strings or ints; time is a number passed in.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kmq_dagster.core.ordering import LaneScheduler, Ordering, Source

P0: Source = ("orders", 0)
P1: Source = ("orders", 1)


def key_ordered(*messages: tuple[str, Source, bytes | None]) -> LaneScheduler[str]:
    """A key-ordered scheduler with room for 8 in flight, given ``messages`` (id, partition,
    key) in this order, at offsets counted from 0 on each partition."""
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.KEY, max_in_flight=8)
    offsets: Counter[Source] = Counter()
    for message_id, source, key in messages:
        scheduler.add(message_id, source, offsets[source], key)
        offsets[source] += 1
    return scheduler


def test_two_keys_run_in_parallel_and_one_key_waits() -> None:
    # given key a twice and key b once, on one partition
    scheduler = key_ordered(("a1", P0, b"a"), ("b1", P0, b"b"), ("a2", P0, b"a"))
    # when taking
    # then a and b start together, the second a waits for the first
    assert scheduler.take(0) == ["a1", "b1"]
    assert (scheduler.in_flight, scheduler.buffered, scheduler.held) == (2, 1, 1)
    assert scheduler.take(0) == []
    scheduler.finish("b1")
    assert scheduler.take(0) == []
    scheduler.finish("a1")
    assert scheduler.take(0) == ["a2"]


def test_one_key_on_two_partitions_is_two_keys() -> None:
    scheduler = key_ordered(("p0", P0, b"a"), ("p1", P1, b"a"))
    assert scheduler.take(0) == ["p0", "p1"]


def test_null_keys_run_in_parallel() -> None:
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.KEY, max_in_flight=8)
    for offset in range(3):
        scheduler.add(f"n{offset}", P0, offset, None)
    assert scheduler.take(0) == ["n0", "n1", "n2"]


def test_partition_order_runs_one_message_per_partition_at_a_time() -> None:
    # given two messages with different keys on each of two partitions
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.PARTITION, max_in_flight=8)
    scheduler.add("x0", P0, 0, b"a")
    scheduler.add("x1", P0, 1, b"b")
    scheduler.add("y0", P1, 5, None)
    scheduler.add("y1", P1, 6, None)
    # then each partition starts its first, and the next only once that one is finished
    assert scheduler.take(0) == ["x0", "y0"]
    assert scheduler.take(0) == []
    scheduler.finish("y0")
    assert scheduler.take(0) == ["y1"]
    scheduler.finish("x0")
    assert scheduler.take(0) == ["x1"]


def test_unordered_starts_anything_up_to_the_limit() -> None:
    scheduler: LaneScheduler[int] = LaneScheduler(Ordering.UNORDERED, max_in_flight=3)
    for offset in range(5):
        scheduler.add(offset, P0, offset, b"same")
    assert scheduler.take(0) == [0, 1, 2]
    assert (scheduler.in_flight, scheduler.buffered, scheduler.held) == (3, 2, 0)


def test_max_in_flight_and_limit_are_respected() -> None:
    # given 6 messages of 6 keys and room for 4 in flight
    scheduler: LaneScheduler[int] = LaneScheduler(Ordering.KEY, max_in_flight=4)
    for offset in range(6):
        scheduler.add(offset, P0, offset, bytes([offset]))
    # then a take asked for 1 starts 1, the next fills the room, and a finish frees one slot
    assert scheduler.take(0, limit=1) == [0]
    assert scheduler.take(0) == [1, 2, 3]
    assert scheduler.take(0) == []
    scheduler.finish(2)
    assert scheduler.take(0) == [4]
    assert scheduler.in_flight == 4


def test_retry_in_place_blocks_the_lane_until_due_and_then_runs_first() -> None:
    # given key a's first message failed and is due again at t=100
    scheduler = key_ordered(("a1", P0, b"a"), ("a2", P0, b"a"), ("b1", P0, b"b"))
    assert scheduler.take(0) == ["a1", "b1"]
    scheduler.retry_in_place("a1", due_ms=100)
    # then neither it nor the rest of key a starts before t=100; other keys flow
    assert scheduler.next_due_ms() == 100
    assert (scheduler.in_flight, scheduler.buffered, scheduler.held) == (1, 2, 2)
    assert scheduler.take(99) == []
    scheduler.finish("b1")
    # and at t=100 the failed message starts again, ahead of the later one
    assert scheduler.take(100) == ["a1"]
    assert scheduler.next_due_ms() is None
    scheduler.finish("a1")
    assert scheduler.take(100) == ["a2"]


def test_forget_drops_only_waiting_messages_of_the_revoked_partitions() -> None:
    # given on P0: one in flight, one waiting behind it, one retried in place; one on P1
    scheduler = key_ordered(("a1", P0, b"a"), ("a2", P0, b"a"), ("b1", P0, b"b"), ("c1", P1, b"c"))
    assert scheduler.take(0) == ["a1", "b1", "c1"]
    scheduler.retry_in_place("b1", due_ms=50)
    scheduler.finish("c1")
    scheduler.add("c2", P1, 1, b"c")
    # when P0 is revoked
    dropped = scheduler.forget([P0])
    # then its waiting messages are returned, the one in flight stays, P1 is untouched
    assert sorted(dropped) == ["a2", "b1"]
    assert scheduler.next_due_ms() is None
    assert (scheduler.in_flight, scheduler.buffered) == (1, 1)
    assert scheduler.take(1_000) == ["c2"]
    scheduler.finish("a1")
    assert scheduler.take(1_000) == []


def test_after_forget_a_source_may_start_over_and_a_duplicate_waits_for_its_original() -> None:
    # given P0 was revoked while offset 0 was in flight, then assigned back to us
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.UNORDERED, max_in_flight=8)
    scheduler.add("first", P0, 0, None)
    assert scheduler.take(0) == ["first"]
    assert scheduler.forget([P0]) == []
    # when offset 0 is fetched again
    scheduler.add("again", P0, 0, None)
    # then it does not run beside its original
    assert scheduler.take(0) == []
    scheduler.finish("first")
    assert scheduler.take(0) == ["again"]


def test_misuse_is_refused() -> None:
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.PARTITION, max_in_flight=1)
    scheduler.add("x", P0, 5, None)
    with pytest.raises(ValueError, match="already added"):
        scheduler.add("x", P1, 0, None)
    with pytest.raises(ValueError, match="not above"):
        scheduler.add("y", P0, 5, None)
    with pytest.raises(ValueError, match="not in flight"):
        scheduler.finish("x")
    with pytest.raises(ValueError, match="not in flight"):
        scheduler.retry_in_place("x", 0)
    with pytest.raises(ValueError, match="max_in_flight"):
        LaneScheduler(Ordering.KEY, max_in_flight=0)


def test_a_run_is_a_lanes_whole_queue_and_its_messages_end_in_order() -> None:
    # given key a three times and key b once
    scheduler = key_ordered(("a1", P0, b"a"), ("b1", P0, b"b"), ("a2", P0, b"a"), ("a3", P0, b"a"))
    # when taking runs
    # then each lane gives its queue, and a run busies one lane however long it is
    assert scheduler.take_runs(0) == [["a1", "a2", "a3"], ["b1"]]
    assert (scheduler.in_flight, scheduler.busy_lanes, scheduler.buffered) == (4, 2, 0)
    with pytest.raises(ValueError, match="ended before"):
        scheduler.finish("a2")
    scheduler.finish("a1")
    assert (scheduler.in_flight, scheduler.busy_lanes) == (3, 2)  # a2 is a's call now
    scheduler.finish("a2")
    scheduler.finish("a3")
    assert (scheduler.in_flight, scheduler.busy_lanes, scheduler.holding) == (1, 1, 1)


def test_a_failure_mid_run_gives_the_rest_back_ahead_of_what_came_after() -> None:
    # given a run a1 a2 a3 taken, and a4 fetched while it runs
    scheduler = key_ordered(("a1", P0, b"a"), ("a2", P0, b"a"), ("a3", P0, b"a"))
    assert scheduler.take_runs(0) == [["a1", "a2", "a3"]]
    scheduler.add("a4", P0, 3, b"a")
    scheduler.finish("a1")
    # when a2 fails: the run's thread gives back a3, then a2 is retried in place at 10
    with pytest.raises(ValueError, match="given back first"):
        scheduler.retry_in_place("a2", 10)
    scheduler.give_back(["a3"])
    scheduler.retry_in_place("a2", 10)
    # then nothing of the lane starts before a2, and after it a3 comes before a4
    assert scheduler.take_runs(9) == []
    assert scheduler.take_runs(10) == [["a2", "a3", "a4"]]


def test_a_run_never_started_makes_its_lane_idle_with_its_head_first() -> None:
    # given a run b1 b2 taken behind a busy run in partition order, and b3 fetched after
    scheduler: LaneScheduler[str] = LaneScheduler(Ordering.PARTITION, max_in_flight=2)
    scheduler.add("b1", P0, 0, None)
    scheduler.add("b2", P0, 1, None)
    assert scheduler.take_runs(0) == [["b1", "b2"]]
    scheduler.add("b3", P0, 2, None)
    # when the worker stops before the run starts: all of it comes back
    with pytest.raises(ValueError, match="not the end of a run"):
        scheduler.give_back(["b1"])  # a run's head comes back with all the rest, or not at all
    scheduler.give_back(["b1", "b2"])
    # then the lane waits again, in offset order
    assert (scheduler.in_flight, scheduler.busy_lanes, scheduler.buffered) == (0, 0, 3)
    assert scheduler.take_runs(0) == [["b1", "b2", "b3"]]


def test_messages_added_behind_a_tagged_run_are_offered_to_it_and_end_in_order() -> None:
    # given a run a1 a2 in flight, tagged by its caller's handle
    scheduler = key_ordered(("a1", P0, b"a"), ("a2", P0, b"a"))
    assert scheduler.take_runs(0) == [["a1", "a2"]]
    scheduler.tag_run("a1", "run-a")
    # when a3 and a4 of its key and b1 of another are added
    scheduler.add("a3", P0, 2, b"a")
    scheduler.add("b1", P0, 3, b"b")
    scheduler.add("a4", P0, 4, b"a")
    # then the run is offered its key's two, once, and b1 waits for a run of its own
    assert scheduler.grown_runs() == [("run-a", ["a3", "a4"])]
    assert scheduler.grown_runs() == []
    with pytest.raises(ValueError, match="not the next messages"):
        scheduler.extend_run(["a4"])
    scheduler.extend_run(["a3"])  # the caller's run took one of them
    assert (scheduler.in_flight, scheduler.busy_lanes, scheduler.buffered) == (3, 1, 2)
    for item in ("a1", "a2", "a3"):
        scheduler.finish(item)
    # and once the run has ended, what it did not take starts as a run of its own, untagged
    assert scheduler.take_runs(0) == [["b1"], ["a4"]]
    scheduler.add("a5", P0, 5, b"a")
    assert scheduler.grown_runs() == []


def test_a_run_given_back_retried_or_forgotten_is_offered_nothing_more() -> None:
    scheduler = key_ordered(("a1", P0, b"a"), ("a2", P0, b"a"), ("b1", P0, b"b"))
    assert scheduler.take_runs(0) == [["a1", "a2"], ["b1"]]
    scheduler.tag_run("a1", "run-a")
    scheduler.tag_run("b1", "run-b")
    # when a's run stops at a1's failure (a2 given back, a1 retried in place) and b's
    # partition is fetched again
    scheduler.give_back(["a2"])
    scheduler.retry_in_place("a1", 10)
    scheduler.forget([P0])
    # then messages of their keys added afterwards join neither run
    scheduler.add("a3", P0, 0, b"a")
    scheduler.add("b2", P0, 1, b"b")
    assert scheduler.grown_runs() == []
    with pytest.raises(ValueError, match="cannot join"):
        scheduler.extend_run(["b2"])


SOURCES: list[Source] = [("t", 0), ("t", 1), ("u", 0)]


class SchedulerModel(RuleBasedStateMachine):
    """Random adds, takes (one by one and in runs), finishes, retries in place, give-backs,
    forgets and clock steps against the rules of invariant 10, the in-flight limit,
    invariant 4 and nothing lost."""

    @initialize(ordering=st.sampled_from(Ordering), max_in_flight=st.integers(1, 4))
    def start(self, ordering: Ordering, max_in_flight: int) -> None:
        self.ordering = ordering
        self.max_in_flight = max_in_flight
        self.scheduler: LaneScheduler[int] = LaneScheduler(ordering, max_in_flight)
        self.now_ms = 0
        self.meta: dict[int, tuple[Source, int, bytes | None]] = {}
        self.next_offset = dict.fromkeys(SOURCES, 0)
        self.waiting: set[int] = set()
        self.in_flight: set[int] = set()
        self.started: set[int] = set()
        self.finished: set[int] = set()
        self.forgotten: set[int] = set()
        #: Items retried in place and not yet due at a take since: item -> due_ms.
        self.retry_pending: dict[int, int] = {}
        #: Runs in flight: the item whose call runs (or is next) -> the rest, in run order.
        self.runs: dict[int, list[int]] = {}

    def calling(self) -> list[int]:
        """In-flight items whose end may be reported now: not behind another in a run."""
        behind = {item for rest in self.runs.values() for item in rest}
        return sorted(self.in_flight - behind)

    def lane(self, item: int) -> object:
        source, _, key = self.meta[item]
        if self.ordering is Ordering.PARTITION:
            return source
        if self.ordering is Ordering.KEY and key is not None:
            return (source, key)
        return item

    def ready(self, item: int) -> bool:
        """May start now if there is room, as of the last take."""
        if item in self.retry_pending:
            return False
        lane, offset = self.lane(item), self.meta[item][1]
        busy = any(self.lane(other) == lane for other in self.in_flight)
        earlier = any(
            self.lane(other) == lane and self.meta[other][1] < offset for other in self.waiting
        )
        return not (busy or earlier)

    @rule(
        source=st.sampled_from(SOURCES),
        gap=st.integers(1, 3),
        key=st.sampled_from([None, b"a", b"b"]),
    )
    def add(self, source: Source, gap: int, key: bytes | None) -> None:
        item = len(self.meta)
        offset = self.next_offset[source] + gap
        self.next_offset[source] = offset
        self.meta[item] = (source, offset, key)
        self.scheduler.add(item, source, offset, key)
        self.waiting.add(item)

    @rule(limit=st.none() | st.integers(0, 3))
    def take(self, limit: int | None) -> None:
        self.due_retries()
        taken = self.scheduler.take(self.now_ms, limit)
        assert len(taken) <= (limit if limit is not None else len(taken))
        for item in taken:
            self.starts(item)
        self.check_room(limit)

    @rule()
    def take_runs(self) -> None:
        self.due_retries()
        for run in self.scheduler.take_runs(self.now_ms):
            lane = self.lane(run[0])
            assert self.ready(run[0]), f"{run[0]} started out of turn"
            queued = [item for item in self.waiting if self.lane(item) == lane]
            assert run == sorted(queued, key=lambda item: self.meta[item][1]), "not its lane"
            for item in run:
                self.starts(item)
            self.runs[run[0]] = run[1:]
        self.check_room(None)

    def due_retries(self) -> None:
        for item, due_ms in list(self.retry_pending.items()):
            if due_ms <= self.now_ms:
                del self.retry_pending[item]

    def starts(self, item: int) -> None:
        assert item in self.waiting
        lane, offset = self.lane(item), self.meta[item][1]
        assert not any(self.lane(s) == lane and self.meta[s][1] > offset for s in self.started), (
            f"{item} started after a later message of its lane"
        )
        self.waiting.remove(item)
        self.in_flight.add(item)
        self.started.add(item)

    def check_room(self, limit: int | None) -> None:
        busy = len({self.lane(item) for item in self.in_flight})
        assert busy <= self.max_in_flight
        assert self.scheduler.busy_lanes == busy
        if limit is None and busy < self.max_in_flight:
            stuck = [item for item in self.waiting if self.ready(item)]
            assert not stuck, f"{stuck} could start but did not"

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self.calling()))
        self.scheduler.finish(item)
        self.in_flight.remove(item)
        self.finished.add(item)
        rest = self.runs.pop(item, [])
        if rest:
            self.runs[rest[0]] = rest[1:]

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), delay_ms=st.integers(0, 2) | st.integers(0, 50))
    def retry_in_place(self, data: st.DataObject, delay_ms: int) -> None:
        item = data.draw(st.sampled_from(self.calling()))
        rest = self.runs.pop(item, [])
        if rest:  # the call failed mid-run: what the run did not start comes back first
            with pytest.raises(ValueError, match="given back first"):
                self.scheduler.retry_in_place(item, self.now_ms + delay_ms)
            self.scheduler.give_back(rest)
            self.in_flight -= set(rest)
            self.started -= set(rest)
            self.waiting |= set(rest)
        self.scheduler.retry_in_place(item, self.now_ms + delay_ms)
        self.in_flight.remove(item)
        self.waiting.add(item)
        self.retry_pending[item] = self.now_ms + delay_ms

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def give_back_a_run_never_started(self, data: st.DataObject) -> None:
        # the worker stops before the run's next call: it and the rest come back
        item = data.draw(st.sampled_from(sorted(self.runs)))
        back = [item, *self.runs.pop(item)]
        self.scheduler.give_back(back)
        self.in_flight -= set(back)
        self.started -= set(back)
        self.waiting |= set(back)

    @rule(step_ms=st.integers(0, 2) | st.integers(0, 60))
    def advance(self, step_ms: int) -> None:
        self.now_ms += step_ms

    @rule(sources=st.sets(st.sampled_from(SOURCES), min_size=1))
    def forget(self, sources: set[Source]) -> None:
        dropped = self.scheduler.forget(sources)
        expected = {item for item in self.waiting if self.meta[item][0] in sources}
        assert sorted(dropped) == sorted(expected)
        self.waiting -= expected
        self.forgotten |= expected
        for item in expected:
            self.retry_pending.pop(item, None)

    @invariant()
    def counts_match_and_nothing_is_lost(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        assert self.waiting | self.in_flight | self.finished | self.forgotten == set(self.meta)
        assert self.scheduler.in_flight == len(self.in_flight)
        assert self.scheduler.buffered == len(self.waiting)
        assert self.scheduler.held == sum(not self.ready(item) for item in self.waiting)
        pending = self.retry_pending.values()
        assert self.scheduler.next_due_ms() == (min(pending) if pending else None)

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        # Everything still here ends: finish whatever starts until nothing is left.
        for _ in range(2 * len(self.meta) + 1):
            for run in self.scheduler.take_runs(10**12):
                self.in_flight.update(run)
                self.runs[run[0]] = run[1:]
            for item in self.calling():
                self.scheduler.finish(item)
                self.in_flight.remove(item)
                rest = self.runs.pop(item, [])
                if rest:
                    self.runs[rest[0]] = rest[1:]
        assert (self.scheduler.buffered, self.scheduler.in_flight) == (0, 0)


SchedulerModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_scheduler_keeps_its_promises = SchedulerModel.TestCase
