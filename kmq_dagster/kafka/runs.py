"""Contiguous offset runs of fetched records: what one start or end marker covers (the pure
run maths is :mod:`kmq_dagster.core.ranges`; this module reads Kafka records).

A fetched batch holds a few chunks, each a stretch of one partition's records in offset order
(a Kafka consumer delivers every partition in order). :func:`fetched_runs` finds the chunks
with C-speed passes over the batch and touches single records only at chunk edges; anything
that is not such a chunk is grouped record by record.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from typing import cast

from confluent_kafka import Message

from kmq_dagster.core.ranges import OffsetRun, Source, append_run, offset_runs
from kmq_dagster.kafka.message import record_offset, record_source

_topic_of = Message.topic
_partition_of = Message.partition
_offset_of = Message.offset


def fetched_runs(records: list[Message]) -> list[OffsetRun]:
    """The runs covering exactly ``records``, fetched records whose offsets ascend per partition.

    Adjacent runs of one partition are merged, so a batch fetched from P partitions usually
    gives P runs.
    """
    if not records:
        return []
    topics = list(map(_topic_of, records))
    partitions = list(map(_partition_of, records))
    size = len(records)
    # Usually the whole batch is one stretch of one partition: two C-speed counts show it.
    if partitions.count(partitions[0]) == size and topics.count(topics[0]) == size:
        return _chunk_runs(records, 0, size)
    runs: list[OffsetRun] = []
    start = 0
    for _partition, chunk in groupby(partitions):
        end = start + len(list(chunk))
        if topics[start:end].count(topics[start]) == end - start:
            chunk_runs = _chunk_runs(records, start, end)
        else:  # several topics with one partition number
            chunk_runs = record_runs(records[start:end])
        for run in chunk_runs:
            append_run(runs, run)
        start = end
    return runs


def _chunk_runs(records: list[Message], start: int, end: int) -> list[OffsetRun]:
    """Runs of ``records[start:end]``, all of one topic and partition."""
    first = record_offset(records[start])
    if record_offset(records[end - 1]) - first == end - start - 1:
        return [(record_source(records[start]), first, end - start)]
    return record_runs(records[start:end])  # a gap in the offsets


def record_runs(records: Iterable[Message]) -> list[OffsetRun]:
    """The runs covering ``records``, in any order; duplicates collapse. Each record is read
    in C-speed passes (acknowledgements out of order, at concurrency 100, come here by the
    thousand: docs/benchmarks.md, stop 72)."""
    batch = records if isinstance(records, list) else list(records)
    if not batch:
        return []
    topics = list(map(_topic_of, batch))
    partitions = list(map(_partition_of, batch))
    read = list(map(_offset_of, batch))
    # As record_offset reads them (a fetched record always has one).
    offsets = [offset or 0 for offset in read] if None in read else cast(list[int], read)
    size = len(batch)
    if partitions.count(partitions[0]) == size and topics.count(topics[0]) == size:
        source = (topics[0] or "", partitions[0] or 0)
        return [(source, first, count) for first, count in offset_runs(offsets)]
    per_source: dict[Source, list[int]] = {}
    for topic, partition, offset in zip(topics, partitions, offsets, strict=True):
        per_source.setdefault((topic or "", partition or 0), []).append(offset)
    return [
        (source, first, count)
        for source, source_offsets in per_source.items()
        for first, count in offset_runs(source_offsets)
    ]
