"""In-memory stand-ins for the Kafka side of the worker loop: records, a producer whose
deliveries can fail, and a consumer with KmqConsumer's interface. No broker, no threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.worker.handler_runner import CallEnd, Unstarted


@dataclass
class FakeRecord:
    """What the worker reads of a confluent-kafka record."""

    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None = b""
    _key: bytes | None = None
    _headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    _timestamp_ms: int = 1_700_000_000_000

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp_ms)

    def error(self) -> None:
        return None


def message(topic: str, offset: int, value: bytes = b"v", **fields: Any) -> KmqMessage:
    """A message as the consumer hands it out, at partition 0."""
    return KmqMessage(FakeRecord(topic, 0, offset, value, **fields))  # type: ignore[arg-type]


def call_ends(taken: Sequence[CallEnd | Unstarted]) -> list[CallEnd]:
    """The ends a runner's ``take_ends`` gave, all of calls that ran (nothing was stopped)."""
    ends = [end for end in taken if isinstance(end, CallEnd)]
    assert len(ends) == len(taken), f"calls left unstarted: {taken!r}"
    return ends


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    partition: int | None

    def header(self, name: str) -> bytes | None:
        return dict(self.headers).get(name)


class FakeProducer:
    """Records what is produced; deliveries to ``failing_topics`` fail on flush."""

    def __init__(self, failing_topics: set[str] | None = None) -> None:
        self.failing_topics = failing_topics or set()
        self.delivered: list[Produced] = []
        self._pending: list[tuple[Produced, Callable[[KafkaError | None, Any], None] | None]] = []

    def produce(self, topic: str, **fields: Any) -> None:
        record = Produced(
            topic, fields.get("value"), fields.get("key"), list(fields.get("headers") or []),
            fields.get("partition"),
        )  # fmt: skip
        self._pending.append((record, fields.get("on_delivery")))

    def poll(self, _timeout: float = 0) -> int:
        return self.flush()

    def flush(self, _timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for record, report in pending:
            failed = record.topic in self.failing_topics
            if not failed:
                self.delivered.append(record)
            written = FakeRecord(
                record.topic, record.partition or 0, len(self.to(record.topic)) - 1
            )
            if report is not None:
                report(KafkaError(KafkaError._MSG_TIMED_OUT) if failed else None, written)
        return 0

    def to(self, topic: str) -> list[Produced]:
        return [record for record in self.delivered if record.topic == topic]


class FakeConsumer:
    """A :class:`~kmq_dagster.worker.worker.LoopConsumer` over a list of messages: hands out
    batches, records acks, nacks, visibility extensions and whether fetching is held (mypy
    checks it against that protocol where the tests pass it to the loop)."""

    def __init__(self, batches: list[list[KmqMessage]], visibility_timeout_ms: int = 30_000):
        self.batches = batches
        self.visibility_timeout_ms = visibility_timeout_ms
        self.acked: list[KmqMessage] = []
        self.nacked: list[KmqMessage] = []
        self.extended: list[tuple[KmqMessage, float]] = []
        self.held_fetching: list[bool] = []
        self.closed = False
        #: The fake cannot tell retry topics: every fetch may carry metadata (checked).
        self.fetch_has_metadata = True

    def poll(self, timeout_s: float = 1.0) -> list[KmqMessage]:
        if self.held_fetching and self.held_fetching[-1]:
            return []
        return self.batches.pop(0) if self.batches else []

    def ack(self, message: KmqMessage) -> None:
        self.acked.append(message)

    def acknowledger(self) -> Callable[[KmqMessage], None]:
        return self.ack

    def nack(self, message: KmqMessage) -> None:
        self.nacked.append(message)

    def extend(self, message: KmqMessage, seconds: float) -> None:
        self.extended.append((message, seconds))

    def hold_fetching(self, hold: bool) -> None:
        self.held_fetching.append(hold)

    def close(self) -> None:
        self.closed = True


class FakeClock:
    """Milliseconds that move only when told."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class FakeSecondsClock:
    """Monotonic seconds that move only when a test sets ``now_s``."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s
