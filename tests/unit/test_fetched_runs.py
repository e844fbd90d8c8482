"""Runs of fetched records: what the start markers of a batch cover."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.ranges import OffsetRun
from kmq_dagster.kafka.message import KmqMessage, record_of, views_of
from kmq_dagster.kafka.runs import fetched_runs, record_runs


def record(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"v")


def covered(runs: list[OffsetRun]) -> list[tuple[str, int, int]]:
    return sorted((t, p, first + i) for (t, p), first, count in runs for i in range(count))


def test_one_stretch_of_one_partition_is_one_run() -> None:
    records = [record("orders", 3, offset) for offset in range(100, 600)]

    assert fetched_runs(records) == [(("orders", 3), 100, 500)]


def test_a_gap_in_the_offsets_splits_the_run() -> None:
    # e.g. a transaction marker or a compacted-away record between 102 and 105
    records = [record("orders", 0, offset) for offset in (100, 101, 102, 105, 106)]

    assert fetched_runs(records) == [(("orders", 0), 100, 3), (("orders", 0), 105, 2)]


def test_chunks_of_two_partitions_merge_per_partition() -> None:
    records = (
        [record("orders", 0, o) for o in range(3)]
        + [record("orders", 1, o) for o in range(10, 12)]
        + [record("orders", 0, o) for o in range(3, 5)]
    )

    assert sorted(fetched_runs(records)) == [(("orders", 0), 0, 5), (("orders", 1), 10, 2)]


def test_equal_partition_numbers_of_two_topics_stay_apart() -> None:
    # the queue and its redelivery topic both have a partition 0
    records = [record("orders", 0, 7), record("orders.g.redelivery", 0, 8), record("orders", 0, 9)]

    assert covered(fetched_runs(records)) == [
        ("orders", 0, 7),
        ("orders", 0, 9),
        ("orders.g.redelivery", 0, 8),
    ]


def test_nothing_fetched_has_no_runs() -> None:
    assert fetched_runs([]) == []


def test_record_runs_take_any_order_and_collapse_duplicates() -> None:
    records = [record("orders", 0, o) for o in (5, 3, 4, 4, 9)]

    assert record_runs(records) == [(("orders", 0), 3, 3), (("orders", 0), 9, 1)]


@st.composite
def fetched_batches(draw: st.DrawFn) -> list[Message]:
    """What a consumer can fetch: per (topic, partition) ascending offsets with gaps, cut
    into chunks and interleaved."""
    sources = draw(
        st.lists(
            st.tuples(st.sampled_from(["q", "q.redelivery"]), st.integers(0, 2)),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    chunks: list[list[Message]] = []
    for topic, partition in sources:
        offset = draw(st.integers(0, 1_000))
        records = []
        for _ in range(draw(st.integers(1, 12))):
            records.append(record(topic, partition, offset))
            offset += draw(st.sampled_from([1, 1, 1, 2, 5]))
        cuts = sorted(draw(st.lists(st.integers(1, len(records)), max_size=3)))
        chunks += [
            records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True) if b > a
        ]
    # interleave chunks, keeping each source's chunks in order
    order = draw(st.permutations(range(len(chunks))))
    by_source: dict[tuple[str, int], list[list[Message]]] = {}
    for chunk in chunks:
        by_source.setdefault((chunk[0].topic() or "", chunk[0].partition() or 0), []).append(chunk)
    queues = list(by_source.values())
    batch: list[Message] = []
    for index in order:
        queue = queues[index % len(queues)]
        if queue:
            batch += queue.pop(0)
    for queue in queues:
        for chunk in queue:
            batch += chunk
    return batch


@given(fetched_batches())
def test_start_marker_runs_cover_exactly_the_fetched_records(records: list[Message]) -> None:
    runs = fetched_runs(records)

    # every fetched record is covered (nothing is committed without a start marker) and no
    # offset that was not fetched is (the tracker would redeliver what nobody received)
    assert covered(runs) == sorted(
        (r.topic() or "", r.partition() or 0, r.offset() or 0) for r in records
    )
    assert all(count >= 1 for _, _, count in runs)


@given(fetched_batches(), st.randoms(use_true_random=False), st.integers(0, 5))
def test_acknowledged_records_in_any_order_give_maximal_runs_of_exactly_them(
    fetched: list[Message], rng: random.Random, duplicates: int
) -> None:
    # given what was fetched, acknowledged in any order, some twice (end markers' input)
    acked = fetched + [rng.choice(fetched) for _ in range(duplicates)]
    rng.shuffle(acked)

    runs = record_runs(acked)

    # then the runs cover each acknowledged record once and nothing else, and no two runs of
    # a partition touch (each is as long as it can be)
    assert covered(runs) == sorted(
        {(r.topic() or "", r.partition() or 0, r.offset() or 0) for r in acked}
    )
    ends = {(source, first + count) for source, first, count in runs}
    assert not any((source, first) in ends for source, first, _ in runs)


def test_record_of_unwraps_views_and_refuses_anything_else() -> None:
    raw = record("orders", 0, 1)

    assert record_of(raw) is raw
    assert record_of(KmqMessage(raw)) is raw
    with pytest.raises(TypeError, match="not a message from a kmq consumer"):
        record_of("orders[0]@1")  # type: ignore[arg-type]


def test_views_of_wraps_each_record_in_order_like_the_constructor() -> None:
    records = [
        Message(topic="orders", partition=p, offset=o, key=b"k", value=b"v", headers=[("h", b"1")])
        for p, o in ((0, 5), (1, 9), (0, 6))
    ]

    views = views_of(records)

    # the same state as the constructor leaves, slot by slot (guards views_of against a new
    # field set in __init__)
    constructed = KmqMessage(records[0])
    assert [hasattr(views[0], slot) for slot in KmqMessage.__slots__] == [
        hasattr(constructed, slot) for slot in KmqMessage.__slots__
    ]
    assert [view.record for view in views] == records
    assert [(v.topic, v.partition, v.offset) for v in views] == [
        ("orders", 0, 5),
        ("orders", 1, 9),
        ("orders", 0, 6),
    ]
    assert all(type(view) is KmqMessage for view in views)
    assert views[1].headers == [("h", b"1")] and views[1].value == b"v"
    assert len({id(view) for view in views}) == 3  # one view per record, never shared
    assert views_of([]) == []
