"""HandoutLedger: acks matched to whole handed-out batches, everything else left over."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.handouts import HandoutLedger, OffsetRun
from kmq_dagster.core.ranges import offset_runs


@dataclass(eq=False)  # identity, like the records a consumer hands out
class Item:
    partition: int
    offset: int


def batch(partition: int, first: int, size: int) -> tuple[list[Item], list[OffsetRun]]:
    items = [Item(partition, first + i) for i in range(size)]
    return items, [(("t", partition), first, size)]


def covered(runs: list[OffsetRun]) -> set[tuple[int, int]]:
    return {(source[1], first + i) for source, first, count in runs for i in range(count)}


def test_a_whole_batch_acknowledged_in_order_is_its_runs() -> None:
    ledger: HandoutLedger[Item] = HandoutLedger()
    items, runs = batch(0, 100, 50)
    ledger.record(items, runs)

    matched = ledger.match(list(items))

    assert matched.runs == runs
    assert matched.matched == 50
    assert matched.leftovers == []
    assert len(ledger) == 0


def test_part_of_a_batch_and_acks_out_of_order_are_left_over() -> None:
    ledger: HandoutLedger[Item] = HandoutLedger()
    first, first_runs = batch(0, 0, 10)
    second, second_runs = batch(1, 0, 10)
    ledger.record(first, first_runs)
    ledger.record(second, second_runs)

    # the first 4 of one batch, then the other batch reversed
    acked = first[:4] + second[::-1]
    matched = ledger.match(acked)

    assert matched.runs == []
    assert matched.leftovers == acked
    # and the rest of the first batch, acknowledged later, is left over too (never its runs)
    later = ledger.match(first[4:])
    assert later.runs == [] and later.leftovers == first[4:]


def test_batches_interleaved_with_strays_match_whole_and_keep_the_strays() -> None:
    ledger: HandoutLedger[Item] = HandoutLedger()
    first, first_runs = batch(0, 0, 5)
    second, second_runs = batch(0, 5, 5)
    stray = Item(1, 42)
    ledger.record(first, first_runs)
    ledger.record(second, second_runs)

    matched = ledger.match([stray, *first, first[0], *second])

    assert matched.runs == first_runs + second_runs
    assert matched.leftovers == [stray, first[0]]


def test_a_batch_beyond_the_capacity_is_forgotten_and_its_acks_left_over() -> None:
    ledger: HandoutLedger[Item] = HandoutLedger(capacity=2)
    batches = [batch(0, 10 * i, 10) for i in range(3)]
    for items, runs in batches:
        ledger.record(items, runs)

    matched = ledger.match([item for items, _ in batches for item in items])

    assert matched.runs == batches[1][1] + batches[2][1]
    assert matched.leftovers == batches[0][0]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        HandoutLedger(capacity=0)


@st.composite
def handouts_and_acks(draw: st.DrawFn) -> tuple[list[list[Item]], list[list[Item]]]:
    """Batches handed out, and the acks drained in several goes: any subset, any order,
    with duplicates, mostly whole batches in order (the case the ledger speeds up)."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    batches: list[list[Item]] = []
    next_offset = {0: 0, 1: 0}
    for index, size in enumerate(sizes):
        partition = index % 2
        batches.append([Item(partition, next_offset[partition] + i) for i in range(size)])
        next_offset[partition] += size
    acked: list[Item] = []
    for items in batches:
        how = draw(st.sampled_from(["whole", "whole", "none", "subset"]))
        if how == "whole":
            acked += items
        elif how == "subset":
            acked += draw(st.lists(st.sampled_from(items), max_size=2 * len(items)))
    acked = draw(st.sampled_from([acked, list(reversed(acked)), draw(st.permutations(acked))]))
    cuts = sorted(draw(st.lists(st.integers(0, len(acked)), max_size=3)))
    drains = [acked[a:b] for a, b in zip([0, *cuts], [*cuts, len(acked)], strict=True)]
    return batches, drains


@given(handouts_and_acks(), st.integers(1, 4))
def test_runs_cover_exactly_the_acknowledged_messages(
    case: tuple[list[list[Item]], list[list[Item]]], capacity: int
) -> None:
    batches, drains = case
    ledger: HandoutLedger[Item] = HandoutLedger(capacity)
    for items in batches:
        ledger.record(items, [(("t", items[0].partition), items[0].offset, len(items))])

    ended: set[tuple[int, int]] = set()
    for drained in drains:
        matched = ledger.match(drained)
        ended |= covered(matched.runs)
        # what a consumer does with leftovers: runs from each message's own coordinates
        for partition in (0, 1):
            offsets = [i.offset for i in matched.leftovers if i.partition == partition]
            ended |= covered([(("t", partition), f, c) for f, c in offset_runs(offsets)])
        assert matched.matched + len(matched.leftovers) == len(drained)

    # an end marker never covers a message nobody acknowledged, and covers every acked one
    assert ended == {(i.partition, i.offset) for drained in drains for i in drained}
