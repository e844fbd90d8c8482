"""What the worker loop shares with its callers and tests: the handler type, the consumer it
needs (:class:`LoopConsumer`) and the counts it keeps (:class:`WorkerStats`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.message import KmqMessage

Handler = Callable[[KmqMessage], object]


@dataclass
class WorkerStats:
    """A loop's counts: written by its thread only, read by any (logs, ``--metrics-port``)."""

    handled: int = 0
    failed: int = 0
    #: Failures retried in place (key order): retries that never reach a retry topic.
    retried_in_place: int = 0
    #: Handler calls running now.
    calls_in_flight: int = 0
    #: Fetched messages waiting to start: their lane busy, their retry not due, no free
    #: slot, or the breaker open.
    held: int = 0
    #: Waits from fetch to first call start.
    waits: WaitHistogram | None = None


class LoopConsumer(Protocol):
    """What the worker loop uses of a consumer: :class:`KmqConsumer` has it, and so has the
    unit tests' fake (mypy checks both against it)."""

    @property
    def visibility_timeout_ms(self) -> int: ...

    #: False when no message of the last poll can carry retry metadata (no headers, no
    #: retry topic): the loop then skips the per-message check.
    fetch_has_metadata: bool

    def poll(self, timeout_s: float = ...) -> list[KmqMessage]: ...

    def ack(self, message: KmqMessage) -> None: ...

    def acknowledger(self) -> Callable[[KmqMessage], None]:
        """What :meth:`ack` does, for a loop acknowledging every message it runs."""
        ...

    def nack(self, message: KmqMessage) -> None: ...

    def extend(self, message: KmqMessage, seconds: float) -> None: ...

    def hold_fetching(self, hold: bool) -> None: ...
