"""Commits wait for durable start markers, in fetch order; a failed marker re-fetches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.commits import CommitQueue

P0 = ("orders", 0)
P1 = ("orders", 1)


def test_a_batch_is_committed_only_after_all_its_markers_are_acknowledged() -> None:
    queue = CommitQueue()
    batch = queue.add({P0: (0, 100), P1: (0, 50)}, markers=2)
    queue.marker_delivered(batch, ok=True)
    assert queue.take_ready().commit == {}
    queue.marker_delivered(batch, ok=True)
    assert queue.take_ready().commit == {P0: 100, P1: 50}
    assert queue.pending() == 0


def test_a_later_batch_never_commits_past_an_earlier_outstanding_one() -> None:
    queue = CommitQueue()
    first = queue.add({P0: (0, 100)}, markers=1)
    second = queue.add({P0: (100, 200)}, markers=1)
    queue.marker_delivered(second, ok=True)
    assert queue.take_ready().commit == {}
    queue.marker_delivered(first, ok=True)
    assert queue.take_ready().commit == {P0: 200}


def test_a_failed_marker_rewinds_its_partitions_and_drops_later_positions_there() -> None:
    queue = CommitQueue()
    failed = queue.add({P0: (0, 100)}, markers=1)
    later = queue.add({P0: (100, 200), P1: (0, 10)}, markers=1)
    queue.marker_delivered(failed, ok=False)
    queue.marker_delivered(later, ok=True)
    ready = queue.take_ready()
    assert ready.rewind == {P0: 0}
    assert ready.commit == {P1: 10}  # P1 had no failure; P0's later position is dropped


def test_forgotten_partitions_are_never_committed() -> None:
    queue = CommitQueue()
    batch = queue.add({P0: (0, 5), P1: (0, 5)}, markers=1)
    queue.forget({P0})
    queue.marker_delivered(batch, ok=True)
    assert queue.take_ready().commit == {P1: 5}


@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 3)), min_size=1, max_size=12),
    st.randoms(use_true_random=False),
    st.floats(0, 0.3),
)
def test_commit_never_passes_a_message_whose_marker_is_not_durable(
    batches: list[tuple[int, int]], rng: object, failure_rate: float
) -> None:
    import random

    assert isinstance(rng, random.Random)
    queue = CommitQueue()
    position = 0
    outcome: dict[int, bool] = {}  # batch id -> every marker ok
    deliveries: list[tuple[int, bool]] = []
    ranges: dict[int, tuple[int, int]] = {}
    for size, markers in batches:
        batch = queue.add({P0: (position, position + size)}, markers=markers)
        ranges[batch] = (position, position + size)
        position += size
        for _ in range(markers):
            ok = rng.random() >= failure_rate
            deliveries.append((batch, ok))
            outcome[batch] = outcome.get(batch, True) and ok
    rng.shuffle(deliveries)
    delivered: dict[int, int] = {}
    committed = 0
    for batch, ok in deliveries:
        queue.marker_delivered(batch, ok)
        delivered[batch] = delivered.get(batch, 0) + 1
        ready = queue.take_ready()
        if P0 in ready.rewind:
            break  # the consumer seeks back; later positions are fetched again
        committed = ready.commit.get(P0, committed)
        # every offset below the commit belongs to a batch whose markers all succeeded
        for batch_id, (first, _end) in ranges.items():
            if first < committed:
                assert outcome[batch_id]
                assert delivered.get(batch_id) == next(
                    m for i, (_, m) in enumerate(batches) if i == batch_id
                )
