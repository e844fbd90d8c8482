"""What a queue is doing, as a value: lag, in flight, retries, dead letters, breaker state.

:class:`QueueStatus` is measured by :func:`kmq_dagster.operations.queue_status.measure_queue` and
read by ``kmq status``, the Dagster sensors and the console; the decisions made from it (is
there work, which run key, which rates) are pure functions here, so every front end decides
alike.

Examples:
    >>> lag = PartitionLag("orders", 0, end_offset=120, committed=100)
    >>> lag.pending
    20
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

#: Breaker state reported when no audit store was consulted.
BREAKER_UNKNOWN = "unknown"


@dataclass(frozen=True)
class PartitionLag:
    """One partition a group consumes: where its log ends and where the group stands."""

    topic: str
    partition: int
    #: The partition's high watermark, from a fetch response (never from ListOffsets).
    end_offset: int
    #: The group's committed offset (0 where it never committed).
    committed: int

    @property
    def pending(self) -> int:
        """Messages the group has not fetched yet."""
        return max(0, self.end_offset - self.committed)


@dataclass(frozen=True)
class RetryHead:
    """The next message of one retry partition: when it is due (``None``: no due header)."""

    topic: str
    partition: int
    due_ms: int | None


@dataclass(frozen=True)
class QueueStatus:
    """A queue and group at one moment (``measured_at_ms``, epoch milliseconds)."""

    topic: str
    group: str
    measured_at_ms: int
    #: The queue topic's partitions.
    lags: tuple[PartitionLag, ...]
    #: The group's redelivery topic's partitions.
    redelivery: tuple[PartitionLag, ...] = ()
    #: Every retry topic's partitions.
    retries: tuple[PartitionLag, ...] = ()
    #: Head of each retry partition with pending messages.
    retry_heads: tuple[RetryHead, ...] = ()
    #: Messages started and not acknowledged (from the markers topic).
    inflight: int = 0
    #: When the oldest unacknowledged message was started (epoch ms), if any is.
    oldest_unacked_started_ms: int | None = None
    #: In-flight messages whose visibility deadline has passed (the tracker's work).
    overdue: int = 0
    #: Whether the markers were read to their end (else in-flight figures are a lower bound).
    markers_complete: bool = True
    #: Records in the group's dead-letter topic.
    dlq_depth: int = 0
    #: Dead letters the audit store has not ingested yet.
    dlq_uningested: int = 0
    breaker_state: str = BREAKER_UNKNOWN
    #: When the breaker last opened (epoch ms), while it is open or half-open.
    breaker_opened_at_ms: int | None = None
    #: How long the open breaker waits before probing (ms).
    breaker_cooldown_ms: int | None = None

    # -- totals ------------------------------------------------------------------------------

    @property
    def lag(self) -> int:
        """Messages on the queue topic the group has not fetched yet."""
        return sum(p.pending for p in self.lags)

    @property
    def redelivery_lag(self) -> int:
        """Copies waiting on the group's redelivery topic: redelivered by the tracker, or
        replayed back to the group by an operator."""
        return sum(p.pending for p in self.redelivery)

    @property
    def retry_depths(self) -> dict[str, int]:
        """Messages waiting per retry topic (due or not)."""
        depths: dict[str, int] = {}
        for p in self.retries:
            depths[p.topic] = depths.get(p.topic, 0) + p.pending
        return depths

    @property
    def due_retries(self) -> int:
        """Messages waiting in retry partitions whose next message is due now."""
        due = {
            (head.topic, head.partition)
            for head in self.retry_heads
            if head.due_ms is None or head.due_ms <= self.measured_at_ms
        }
        return sum(p.pending for p in self.retries if (p.topic, p.partition) in due)

    @property
    def next_retry_due_ms(self) -> int | None:
        """When the earliest retry not yet due becomes due."""
        waiting = [
            head.due_ms
            for head in self.retry_heads
            if head.due_ms is not None and head.due_ms > self.measured_at_ms
        ]
        return min(waiting, default=None)

    @property
    def oldest_unacked_age_ms(self) -> int | None:
        """How long the oldest unacknowledged message has been in flight."""
        if self.oldest_unacked_started_ms is None:
            return None
        return max(0, self.measured_at_ms - self.oldest_unacked_started_ms)

    @property
    def produced(self) -> int:
        """Every message ever produced to the queue topic (sum of its end offsets)."""
        return sum(p.end_offset for p in self.lags)

    @property
    def consumed(self) -> int:
        """Every message the group has fetched and committed from the queue, redelivery and
        retry topics."""
        return sum(p.committed for p in (*self.lags, *self.redelivery, *self.retries))

    @property
    def failures_written(self) -> int:
        """Every copy ever written to the group's retry topics: handler failures that are
        retried (dead letters are left out: mostly bad input, or failures already counted on
        their way through the retry topics). An operator's replay is not among them: its
        copies go to the redelivery topic (invariant 12), and count as messages finished once
        processed; a replayed copy that fails again is one, on its next retry topic."""
        return sum(p.end_offset for p in self.retries)

    def totals(self) -> dict[str, int]:
        """The running totals :func:`rates_between` compares (JSON-compatible)."""
        return {
            "at_ms": self.measured_at_ms,
            "produced": self.produced,
            "consumed": self.consumed,
            "inflight": self.inflight,
            "failures": self.failures_written,
        }

    # -- decisions ---------------------------------------------------------------------------

    @property
    def work(self) -> int:
        """Messages a processing run would find now: lag, redeliveries, due retries."""
        return self.lag + self.redelivery_lag + self.due_retries

    def run_key(self) -> str:
        """A key naming "this backlog": the same end offsets and committed positions give the
        same key, so two sensor ticks over unchanged offsets request one run. The breaker's
        state and opening are part of it: a run that the breaker stopped before it moved an
        offset must not make the probe run after the cooldown a repeat (Dagster skips a run
        request whose key it has launched, and the breaker would stay half-open)."""
        digest = hashlib.sha256()
        for p in sorted((*self.lags, *self.redelivery, *self.retries), key=_coordinates):
            digest.update(f"{p.topic}:{p.partition}:{p.end_offset}:{p.committed};".encode())
        digest.update(f"breaker:{self.breaker_state}:{self.breaker_opened_at_ms};".encode())
        return f"{self.topic}.{self.group}.{digest.hexdigest()[:16]}"

    def describe_backlog(self) -> str:
        """The figures a person needs to see why there is (or is not) work, in one line."""
        parts = [
            f"lag {self.lag:,} on {len(self.lags)} partitions",
            f"{self.redelivery_lag:,} redelivered or replayed waiting",
            f"{self.due_retries:,} retries due",
        ]
        waiting = sum(self.retry_depths.values()) - self.due_retries
        if waiting > 0:
            parts.append(f"{waiting:,} retries not due yet")
        parts.append(f"{self.inflight:,} in flight")
        return ", ".join(parts)


def _coordinates(p: PartitionLag) -> tuple[str, int]:
    return (p.topic, p.partition)


#: Keys of :meth:`QueueStatus.totals`, the figures rates are computed from.
TOTALS = ("at_ms", "produced", "consumed", "inflight", "failures")


@dataclass(frozen=True)
class Rates:
    """Per-second rates between two measurements of one queue."""

    in_per_s: float
    ack_per_s: float
    failures_per_s: float
    #: Messages processed (acknowledged, retried or dead-lettered) between the two.
    processed: int
    #: Copies written to the retry topics between the two.
    failures: int


def progress_between(earlier: Mapping[str, int], later: Mapping[str, int]) -> tuple[int, int]:
    """Messages finished and retry copies written from ``earlier`` to ``later`` (two
    :meth:`QueueStatus.totals`). Finished is the group's progress minus the growth of what is
    in flight, and is negative while a Spark batch runs: its messages are in flight before its
    offsets are committed at the batch's end."""
    finished = later["consumed"] - earlier["consumed"] - (later["inflight"] - earlier["inflight"])
    return finished, max(0, later["failures"] - earlier["failures"])


def rates_between(earlier: Mapping[str, int], later: QueueStatus) -> Rates:
    """Rates from ``earlier`` (a :meth:`QueueStatus.totals`, e.g. kept in a sensor's cursor)
    to ``later``. Acknowledged messages are estimated as the group's progress minus the growth
    of what is in flight (a consumer commits what it fetched, then acks it), minus failures."""
    now = later.totals()
    seconds = max(0.001, (now["at_ms"] - earlier["at_ms"]) / 1000)
    produced = max(0, now["produced"] - earlier["produced"])
    finished, failures = progress_between(earlier, now)
    processed = max(0, finished)
    acked = max(0, processed - failures)
    return Rates(
        in_per_s=produced / seconds,
        ack_per_s=acked / seconds,
        failures_per_s=failures / seconds,
        processed=processed,
        failures=failures,
    )
