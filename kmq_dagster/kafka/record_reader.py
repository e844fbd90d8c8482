"""Read records at exact offsets (the tracker's view of the message it must redeliver)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kmq_dagster.kafka.clients import new_consumer
from kmq_dagster.settings import KmqSettings


@dataclass
class ReadResult:
    """What a read found: records by offset, offsets known not to exist, and undecided ones."""

    found: dict[int, Message] = field(default_factory=dict)
    #: Offsets the log does not hold: past its end, or removed by retention or compaction.
    gone: list[int] = field(default_factory=list)
    #: Offsets neither found nor ruled out before the timeout; ask again later.
    undecided: list[int] = field(default_factory=list)


#: Records taken from the client per call while scanning.
READ_BATCH = 1_000
#: Prefetch limits: a scan reads what it was asked for, and the tracker's memory must stay
#: bounded with a million messages in flight (librdkafka's defaults buffer up to 64 MB).
PREFETCH_MESSAGES = 5_000
PREFETCH_KBYTES = 4_096
#: Largest fetch response: a broker may answer with up to this much at once (librdkafka's
#: default, 50 MB, is a 50 MB buffer in the tracker); ``-X fetch.max.bytes`` or a larger
#: ``-X message.max.bytes`` raises it (``KmqSettings.fetch_limits``).
FETCH_MAX_BYTES = 1024 * 1024


class RecordReader:
    """Reads records by offset with a consumer that belongs to no group and never commits."""

    def __init__(self, settings: KmqSettings, client_group: str) -> None:
        # librdkafka wants a group.id even for assign(); nothing is ever committed under it.
        self._consumer: Consumer = new_consumer(
            settings,
            client_group,
            **{
                "enable.partition.eof": True,
                **settings.fetch_limits(
                    queued_min_messages=PREFETCH_MESSAGES,
                    queued_max_messages_kbytes=PREFETCH_KBYTES,
                    fetch_max_bytes=FETCH_MAX_BYTES,
                ),
            },
        )

    def read(
        self, topic: str, partition: int, offsets: list[int], timeout_s: float = 10.0
    ) -> ReadResult:
        """Read the records at ``offsets`` of one partition (one forward scan)."""
        wanted = sorted(set(offsets))
        result = ReadResult()
        if not wanted:
            return result
        self._consumer.assign([TopicPartition(topic, partition, wanted[0])])
        deadline = time.monotonic() + timeout_s
        last_wanted = wanted[-1]
        highest_read = -1
        wanted_set = set(wanted)
        done = False
        try:
            while time.monotonic() < deadline and not done:
                for message in self._consumer.consume(READ_BATCH, 0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            # Every wanted offset at or past the end of the log does not exist.
                            end = message.offset() or 0
                            result.gone += [o for o in wanted if o >= end and o not in result.found]
                            done = True
                            break
                        continue
                    offset = message.offset() or 0
                    highest_read = max(highest_read, offset)
                    if offset in wanted_set:
                        result.found[offset] = message
                    if offset >= last_wanted:
                        done = True
                        break
        finally:
            self._consumer.unassign()
        settled = set(result.found) | set(result.gone)
        for offset in wanted:
            if offset in settled:
                continue
            # Skipped over while scanning forward: removed from the log.
            if offset < highest_read:
                result.gone.append(offset)
            else:
                result.undecided.append(offset)
        return result

    def close(self) -> None:
        self._consumer.close()
