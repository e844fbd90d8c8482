"""In-flight state: what is overdue when, and where a restarted tracker may resume.

Time is a plain number passed in; nothing here sleeps.
"""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq_dagster.core.inflight import MessageRef, PartitionInflight
from kmq_dagster.core.markers import EndMarker, StartMarker

T = "orders"


def refs(*offsets: int, partition: int = 0) -> list[MessageRef]:
    return [MessageRef(T, partition, offset) for offset in offsets]


def test_a_message_is_overdue_at_its_deadline_and_not_before() -> None:
    # given a batch of 3 in flight until t=1000
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 10, 3, deadline_ms=1_000))
    # then nothing is overdue before the deadline, everything at it
    assert state.overdue(999) == []
    assert state.overdue(1_000) == refs(10, 11, 12)
    # and reporting does not change state
    assert state.overdue(1_001) == refs(10, 11, 12)


def test_acknowledged_messages_are_never_overdue_even_out_of_order() -> None:
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 0, 5, deadline_ms=100))
    assert state.record_end(EndMarker(T, 0, 3, 1)) == 1
    assert state.record_end(EndMarker(T, 0, 0, 2)) == 2
    assert state.record_end(EndMarker(T, 0, 0, 2)) == 0  # twice is harmless
    assert state.overdue(10_000) == refs(2, 4)
    assert state.inflight_count() == 2


def test_acks_that_touch_a_range_at_its_edges_close_exactly_what_they_name() -> None:
    # given offsets 10..14 in flight, and the longest range ending right before offset 20
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 10, 5, deadline_ms=100))
    state.record_start(1, StartMarker(T, 0, 15, 5, deadline_ms=100))

    # when acks end right before the first range, start right after the last, and touch edges
    assert state.record_end(EndMarker(T, 0, 5, 5)) == 0  # 5..9
    assert state.record_end(EndMarker(T, 0, 20, 3)) == 0  # 20..22
    assert state.record_end(EndMarker(T, 0, 9, 2)) == 1  # 9..10: only 10 was open
    assert state.record_end(EndMarker(T, 0, 19, 1)) == 1  # the last offset of the last range

    # then exactly the offsets in between stay open, and the oldest marker still holds them
    assert state.overdue(100) == refs(11, 12, 13, 14, 15, 16, 17, 18)
    assert state.smallest_open_marker_offset() == 0


def test_extend_moves_the_deadline_of_just_that_message() -> None:
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 0, 3, deadline_ms=100))
    state.record_start(1, StartMarker(T, 0, 1, 1, deadline_ms=500))
    assert state.overdue(100) == refs(0, 2)
    assert state.inflight_count() == 3
    state.record_end(EndMarker(T, 0, 0, 3))
    assert state.overdue(1_000) == []


def test_smallest_open_marker_offset_follows_the_oldest_open_start() -> None:
    state = PartitionInflight()
    assert state.smallest_open_marker_offset() is None
    state.record_start(7, StartMarker(T, 0, 0, 2, 100))
    state.record_start(8, StartMarker(T, 1, 0, 2, 100))
    state.record_start(9, StartMarker(T, 0, 2, 2, 100))
    state.record_end(EndMarker(T, 0, 0, 1))
    assert state.smallest_open_marker_offset() == 7  # offset 1 of partition 0 is still open
    state.record_end(EndMarker(T, 0, 1, 1))
    assert state.smallest_open_marker_offset() == 8
    state.record_end(EndMarker(T, 1, 0, 2))
    state.record_end(EndMarker(T, 0, 2, 2))
    assert state.smallest_open_marker_offset() is None


def test_extended_message_no_longer_holds_back_its_first_marker() -> None:
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 0, 2, 100))
    state.record_end(EndMarker(T, 0, 0, 1))
    state.record_start(5, StartMarker(T, 0, 1, 1, 900))  # extend offset 1
    assert state.smallest_open_marker_offset() == 5


def test_same_offsets_of_different_topics_do_not_collide() -> None:
    state = PartitionInflight()
    state.record_start(0, StartMarker("a", 0, 0, 1, 100))
    state.record_start(1, StartMarker("b", 0, 0, 1, 100))
    state.record_end(EndMarker("a", 0, 0, 1))
    assert state.overdue(100) == [MessageRef("b", 0, 0)]


def test_memory_per_inflight_message_is_small_with_batched_markers() -> None:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    state = PartitionInflight()
    for marker_offset, first in enumerate(range(0, 1_000_000, 500)):
        state.record_start(marker_offset, StartMarker(T, 0, first, 500, 10**12))
    used = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert state.inflight_count() == 1_000_000
    print(f"\n{used / 1_000_000:.2f} bytes per in-flight message")
    assert used / 1_000_000 <= 100


# A model: offset -> (deadline, marker offset) of open messages, per source.
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("start"),
            st.integers(0, 1),
            st.integers(0, 40),
            st.integers(1, 8),
            st.integers(0, 100),
        ),
        st.tuples(st.just("end"), st.integers(0, 1), st.integers(0, 40), st.integers(1, 8)),
        st.tuples(st.just("check"), st.integers(0, 120)),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(operations)
def test_state_matches_a_simple_model(ops: list[tuple[object, ...]]) -> None:
    state = PartitionInflight()
    model: dict[tuple[int, int], tuple[int, int]] = {}
    marker_offset = 0
    for op in ops:
        if op[0] == "start":
            _, partition, first, count, deadline = op
            assert isinstance(partition, int) and isinstance(first, int)
            assert isinstance(count, int) and isinstance(deadline, int)
            state.record_start(marker_offset, StartMarker(T, partition, first, count, deadline))
            for offset in range(first, first + count):
                model[(partition, offset)] = (deadline, marker_offset)
            marker_offset += 1
        elif op[0] == "end":
            _, partition, first, count = op
            assert isinstance(partition, int) and isinstance(first, int)
            assert isinstance(count, int)
            expected = sum(
                model.pop((partition, o), None) is not None for o in range(first, first + count)
            )
            assert state.record_end(EndMarker(T, partition, first, count)) == expected
        else:
            now = op[1]
            assert isinstance(now, int)
            overdue = state.overdue(now)
            # never early, never an acknowledged message, nothing overdue left out
            assert sorted((r.partition, r.offset) for r in overdue) == sorted(
                key for key, (deadline, _) in model.items() if deadline <= now
            )
        assert state.inflight_count() == len(model)
        smallest = state.smallest_open_marker_offset()
        # resuming at the smallest open marker never skips the marker of an open message
        assert smallest == min((m for _, m in model.values()), default=None)
