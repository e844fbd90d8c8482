"""What became of every message of a fault scenario: processed (how often), dead-lettered, lost.

Ids are the message values. The handler (:mod:`kmq_dagster.bench.fault_handler`) writes each
one it processed to a file before returning; dead letters are read back from the DLQ topic.
A message is lost if it is in neither; every processing past the first is a duplicate.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmq_dagster.bench.fault_handler import POISON_PREFIX
from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import KmqTimeoutError
from kmq_dagster.kafka.topic_reader import assigned_reader, read_to_end
from kmq_dagster.settings import KmqSettings

#: How often :meth:`Ledger.wait_until_accounted` looks.
CHECK_INTERVAL_S = 1.0


@dataclass
class Outcome:
    """The figures of one scenario."""

    messages: int
    processed: int
    dead_lettered: int
    lost: int
    duplicates: int
    seconds: float
    #: Messages both processed and dead-lettered: at-least-once allows it (a processed message
    #: whose acknowledgement was lost is redelivered, and may then fail or pass its redelivery
    #: limit).
    processed_and_dead_lettered: int = 0
    #: Poison messages sent, and how many of them were dead-lettered and processed.
    poison: int = 0
    poison_dead_lettered: int = 0
    poison_processed: int = 0

    def figures(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "seconds": round(self.seconds, 1),
            "processed": self.processed,
            "dead_lettered": self.dead_lettered,
            "processed_and_dead_lettered": self.processed_and_dead_lettered,
            "poison": self.poison,
            "poison_dead_lettered": self.poison_dead_lettered,
            "poison_processed": self.poison_processed,
        }


def topic_values(settings: KmqSettings, topic: str, partitions: int) -> list[bytes]:
    """Every value ``topic`` holds now (read from the start, without a group).

    Raises:
        KmqTimeoutError: not read to its end within a minute.
    """
    consumer = assigned_reader(settings, topic, dict.fromkeys(range(partitions), 0))
    try:
        return [
            record.value() or b""
            for batch in read_to_end(consumer, range(partitions), timeout_s=60)
            for record in batch
        ]
    finally:
        consumer.close()


def lines_of(out_dir: Path, kind: str) -> collections.Counter[bytes]:
    """How often each value appears in the handler's ``<kind>-<pid>.log`` files."""
    counts: collections.Counter[bytes] = collections.Counter()
    for path in out_dir.glob(f"{kind}-*.log"):
        counts.update(line for line in path.read_bytes().split(b"\n") if line)
    return counts


class Ledger:
    """The ids sent to ``queue`` and where each ended up."""

    def __init__(
        self, settings: KmqSettings, queue: Queue, out_dir: Path, ids: Collection[bytes]
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.out_dir = out_dir
        self.ids = frozenset(ids)
        self.dlq_partitions = queue.dlq_partitions

    def processed(self) -> collections.Counter[bytes]:
        return lines_of(self.out_dir, "processed")

    def dead_lettered(self) -> set[bytes]:
        return set(topic_values(self.settings, self.queue.dlq_topic, self.dlq_partitions))

    def missing(self) -> set[bytes]:
        """Ids neither processed nor dead-lettered (yet)."""
        missing = set(self.ids) - set(self.processed())
        return missing - self.dead_lettered() if missing else missing

    def wait_until_accounted(
        self, timeout_s: float, progress: Callable[[int], None] | None = None
    ) -> None:
        """Wait until every id is processed or dead-lettered.

        Raises:
            KmqTimeoutError: some were neither within ``timeout_s``: lost, unless more time
                would have brought them.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            missing = self.missing()
            if progress is not None:
                progress(len(self.ids) - len(missing))
            if not missing:
                return
            if time.monotonic() > deadline:
                sample = sorted(missing)[:5]
                raise KmqTimeoutError(
                    f"{len(missing)} of {len(self.ids)} messages neither processed nor "
                    f"dead-lettered within {timeout_s:g} s, e.g. {sample}"
                )
            time.sleep(CHECK_INTERVAL_S)

    def outcome(self, seconds: float) -> Outcome:
        processed = self.processed()
        dead = self.dead_lettered()
        ours = {value: count for value, count in processed.items() if value in self.ids}
        poison = {value for value in self.ids if value.startswith(POISON_PREFIX)}
        return Outcome(
            messages=len(self.ids),
            processed=len(ours),
            dead_lettered=len(dead & self.ids),
            lost=len(self.ids - set(ours) - dead),
            duplicates=sum(count - 1 for count in ours.values()),
            seconds=seconds,
            processed_and_dead_lettered=len(dead & set(ours)),
            poison=len(poison),
            poison_dead_lettered=len(poison & dead),
            poison_processed=len(poison & set(ours)),
        )
