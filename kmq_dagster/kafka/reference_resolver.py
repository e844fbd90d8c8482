"""Replaying a reference dead letter: the value it stands for, read back from its source.

A dead letter for a message too large to copy holds no value, only where the record is
(``core.oversize``). A replay reads that record by its coordinates, while its topic still
retains it, and copies its value; a reference that cannot be resolved stops the replay before
any copy of its chunk is sent, saying why.
"""

from __future__ import annotations

from confluent_kafka import Message

from kmq_dagster.core.headers import normalize_headers
from kmq_dagster.core.oversize import Reference, reference_of
from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import ReferenceUnresolvedError
from kmq_dagster.kafka.record_reader import RecordReader
from kmq_dagster.settings import KmqSettings

#: Seconds a replay waits for the record a reference points at.
READ_TIMEOUT_S = 10.0

#: What an operator can do about a reference that cannot be replayed.
_WAY_OUT = "discard it, or leave it out of the selection (--offsets)"


class ReferenceResolver:
    """Reads the values of ``queue``'s reference dead letters from where they point."""

    def __init__(self, settings: KmqSettings, queue: Queue) -> None:
        self._settings = settings
        self._queue = queue
        self._reader: RecordReader | None = None  # made on the first reference only

    def values(self, records: list[Message]) -> dict[tuple[int, int], bytes | None]:
        """The value each reference among ``records`` stands for, by its DLQ (partition,
        offset); dead letters that are not references are left out.

        Raises:
            ReferenceUnresolvedError: a reference is malformed, points outside the queue, or
                its record is no longer in its topic (or could not be read in time).
        """
        resolved: dict[tuple[int, int], bytes | None] = {}
        for record in records:
            at = (record.partition() or 0, record.offset() or 0)
            where = f"dead letter {record.topic()} [{at[0]}] @ {at[1]}"
            try:
                reference = reference_of(normalize_headers(record.headers()))
            except ValueError as exc:
                raise ReferenceUnresolvedError(f"{where} cannot be replayed: {exc}") from None
            if reference is not None:
                resolved[at] = self._read(where, reference)
        return resolved

    def _read(self, where: str, reference: Reference) -> bytes | None:
        ref = reference.ref
        about = f"{where} stands for {reference.size_bytes:,} bytes at {ref.describe()}"
        if not self._owns(ref.topic):
            # A forged header must not make a replay copy another topic's data into the queue.
            raise ReferenceUnresolvedError(
                f"{about}, which is not a topic of {self._queue.topic} / {self._queue.group}: "
                f"it cannot be replayed; {_WAY_OUT}"
            )
        if self._reader is None:
            group = f"kmq-replay-reader.{self._queue.topic}.{self._queue.group}"
            self._reader = RecordReader(self._settings, group)
        read = self._reader.read(ref.topic, ref.partition, [ref.offset], READ_TIMEOUT_S)
        if ref.offset in read.found:
            return read.found[ref.offset].value()
        if read.gone:
            raise ReferenceUnresolvedError(
                f"{about}, which that topic no longer holds (removed by retention or "
                f"compaction, or the topic was recreated): it cannot be replayed; {_WAY_OUT}"
            )
        raise ReferenceUnresolvedError(
            f"{about}, which could not be read within {READ_TIMEOUT_S:g} s; nothing of its "
            "chunk was sent: run the same replay again"
        )

    def _owns(self, topic: str) -> bool:
        return topic == self._queue.topic or topic.startswith(
            f"{self._queue.topic}.{self._queue.group}."
        )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
