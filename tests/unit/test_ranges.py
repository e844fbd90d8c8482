"""Offset-run maths: what one marker covers, merged wherever runs continue each other."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.ranges import (
    OffsetRun,
    append_run,
    extend_runs,
    merge_runs,
    offset_runs,
    run_bounds,
    source_runs,
)


def offsets_of(runs: list[tuple[int, int]]) -> list[int]:
    return [first + i for first, count in runs for i in range(count)]


def test_a_run_that_continues_the_last_one_is_merged_into_it() -> None:
    # given a partition read up to offset 104
    runs = [(100, 5)]

    # when the next chunk starts at 105, and one after a gap at 200
    extend_runs(runs, [(105, 3), (200, 1)])

    # then the first stays one run
    assert runs == [(100, 8), (200, 1)]


def test_extending_with_nothing_changes_nothing() -> None:
    runs = [(0, 1)]
    extend_runs(runs, [])
    assert runs == [(0, 1)]


def test_merged_runs_cover_exactly_the_same_offsets_in_as_few_runs() -> None:
    assert merge_runs([(0, 2), (2, 2), (4, 1), (9, 3)]) == [(0, 5), (9, 3)]


def test_source_runs_name_their_partition_and_merge() -> None:
    assert source_runs(("orders", 3), [(0, 2), (2, 1), (7, 1)]) == [
        (("orders", 3), 0, 3),
        (("orders", 3), 7, 1),
    ]


def test_append_run_merges_into_the_latest_run_of_its_partition_only() -> None:
    # given runs of partitions 0 and 1, interleaved
    runs: list[OffsetRun] = [(("q", 0), 0, 3), (("q", 1), 10, 2)]

    # when partition 0 continues, partition 1 jumps, and partition 0 continues again
    append_run(runs, (("q", 0), 3, 2))
    append_run(runs, (("q", 1), 20, 1))
    append_run(runs, (("q", 0), 5, 1))

    # then partition 0 is still one run; partition 1's gap starts a new one
    assert runs == [(("q", 0), 0, 6), (("q", 1), 10, 2), (("q", 1), 20, 1)]


def test_append_run_never_merges_across_a_gap_or_a_topic() -> None:
    runs: list[OffsetRun] = [(("q", 0), 0, 3)]
    append_run(runs, (("q", 0), 4, 1))
    append_run(runs, (("q.g.redelivery", 0), 5, 1))
    assert runs == [(("q", 0), 0, 3), (("q", 0), 4, 1), (("q.g.redelivery", 0), 5, 1)]


def test_run_bounds_span_every_run_of_a_partition() -> None:
    runs: list[OffsetRun] = [(("orders", 0), 3, 3), (("orders", 1), 0, 1), (("orders", 0), 9, 1)]

    assert run_bounds(runs) == {("orders", 0): (3, 10), ("orders", 1): (0, 1)}


@given(st.lists(st.lists(st.integers(0, 200), max_size=30), max_size=6))
def test_extending_chunk_by_chunk_equals_the_runs_of_all_offsets(chunks: list[list[int]]) -> None:
    # given ascending, disjoint chunks of offsets (as a slice reads them)
    seen: set[int] = set()
    ordered: list[list[int]] = []
    for chunk in chunks:
        fresh = sorted(set(chunk) - seen)
        fresh = [o for o in fresh if not seen or o > max(seen)]
        seen.update(fresh)
        ordered.append(fresh)

    # when their runs are extended chunk by chunk
    runs: list[tuple[int, int]] = []
    for chunk in ordered:
        extend_runs(runs, offset_runs(chunk))

    # then they are the runs of all offsets at once: same coverage, fully merged
    everything = [o for chunk in ordered for o in chunk]
    assert runs == offset_runs(everything)
    assert offsets_of(runs) == everything


@given(st.lists(st.tuples(st.sampled_from([("q", 0), ("q", 1)]), st.integers(0, 50))))
def test_appended_runs_cover_what_was_appended(items: list[tuple[tuple[str, int], int]]) -> None:
    runs: list[OffsetRun] = []
    for source, offset in items:
        append_run(runs, (source, offset, 1))

    covered = sorted((source, first + i) for source, first, count in runs for i in range(count))
    assert covered == sorted(items)
