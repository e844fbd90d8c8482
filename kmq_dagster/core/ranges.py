"""Offset runs: one marker covers a contiguous run of offsets instead of one message.

Two shapes of run, both ascending and merged where they continue each other:

* ``(first_offset, count)`` for the runs of one partition (Spark keeps these per slice);
* an :data:`OffsetRun`, ``((topic, partition), first_offset, count)``, for runs across
  partitions (what a fetched batch, an acknowledgement drain or a redelivery covers, and what
  :class:`~kmq_dagster.kafka.marker_writer.MarkerWriter` writes markers for).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

#: ``(topic, partition)``: where a run's messages are.
Source = tuple[str, int]
#: ``((topic, partition), first offset, count)``: one marker's worth of messages.
OffsetRun = tuple[Source, int, int]


def offset_runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Coalesce offsets into ``(first_offset, count)`` runs, ascending; duplicates collapse.

    >>> offset_runs([7, 3, 4, 5, 9, 4])
    [(3, 3), (7, 1), (9, 1)]
    """
    ordered = offsets if isinstance(offsets, list) else list(offsets)
    if ordered:
        first, last = ordered[0], ordered[-1]
        # The common case, a fetched or acknowledged batch in order: checked at C speed.
        # equivalent mutant (!= for ==): the length test only spares building the list below.
        same_length = last - first + 1 == len(ordered)
        if same_length and ordered == list(range(first, last + 1)):
            return [(first, len(ordered))]
    unique = sorted(set(ordered))
    if not unique:
        return []
    size = len(unique)
    if unique[-1] - unique[0] + 1 == size:  # acknowledged out of order, but no gap
        return [(unique[0], size)]
    # Where a run ends: the gaps between neighbours, found by one C-speed subtraction pass.
    ends = [i for i, step in enumerate(map(operator.sub, unique[1:], unique), 1) if step != 1]
    starts = [0, *ends]
    return [(unique[start], end - start) for start, end in zip(starts, [*ends, size], strict=True)]


def extend_runs(runs: list[tuple[int, int]], more: Iterable[tuple[int, int]]) -> None:
    """Append ascending ``(first offset, count)`` runs to ``runs``; a run that continues the
    last one is merged into it, so a partition read without gaps stays one run.

    >>> runs = [(0, 3)]
    >>> extend_runs(runs, [(3, 2), (7, 1)])
    >>> runs
    [(0, 5), (7, 1)]
    """
    for first, count in more:
        if runs and sum(runs[-1]) == first:
            runs[-1] = (runs[-1][0], runs[-1][1] + count)
        else:
            runs.append((first, count))


def merge_runs(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ascending ``(first offset, count)`` runs with those that continue each other merged."""
    merged: list[tuple[int, int]] = []
    extend_runs(merged, runs)
    return merged


def source_runs(source: Source, runs: Iterable[tuple[int, int]]) -> list[OffsetRun]:
    """The ascending ``(first offset, count)`` runs of one partition, as offset runs of
    ``source``; those that continue each other are merged.

    >>> source_runs(("orders", 2), [(0, 2), (2, 3), (9, 1)])
    [(('orders', 2), 0, 5), (('orders', 2), 9, 1)]
    """
    return [(source, first, count) for first, count in merge_runs(runs)]


def append_run(runs: list[OffsetRun], run: OffsetRun) -> None:
    """Append ``run``, merged into the latest earlier run of its partition if it continues it.

    >>> runs = [(("orders", 0), 0, 3), (("orders", 1), 10, 2)]
    >>> append_run(runs, (("orders", 0), 3, 2))
    >>> runs
    [(('orders', 0), 0, 5), (('orders', 1), 10, 2)]
    """
    source, first, count = run
    for index in range(len(runs) - 1, -1, -1):
        previous_source, previous_first, previous_count = runs[index]
        if previous_source == source:
            if previous_first + previous_count == first:
                runs[index] = (source, previous_first, previous_count + count)
                return
            break
    runs.append(run)


def run_bounds(runs: Iterable[OffsetRun]) -> dict[Source, tuple[int, int]]:
    """Per partition: the first offset covered and the offset after the last one.

    >>> run_bounds([(("orders", 0), 5, 3), (("orders", 0), 10, 2)])
    {('orders', 0): (5, 12)}
    """
    bounds: dict[Source, tuple[int, int]] = {}
    for source, first, count in runs:
        low, high = bounds.get(source, (first, first + count))
        bounds[source] = (min(low, first), max(high, first + count))
    return bounds
