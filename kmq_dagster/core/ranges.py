"""Contiguous runs of offsets: one marker covers a run instead of one marker per message."""

from __future__ import annotations

from collections.abc import Iterable


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
    runs: list[tuple[int, int]] = []
    for offset in sorted(set(ordered)):
        if runs and runs[-1][0] + runs[-1][1] == offset:
            first, count = runs[-1]
            runs[-1] = (first, count + 1)
        else:
            runs.append((offset, 1))
    return runs
