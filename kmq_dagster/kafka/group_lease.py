"""Ownership of a group's partitions for a batch job (the Spark driver) by group membership.

The lease is a member of the consumer group: the group gives it partitions, as it gives them to
``kmq worker`` processes, so two jobs (or a job and workers) never own the same partition. It
fetches nothing (its partitions stay paused); a background thread keeps it in the group. Offsets
are committed through it, and Kafka refuses commits from a member that lost the partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kmq_dagster.kafka.clients import ClientErrors, new_consumer
from kmq_dagster.kafka.group_exit import LEAVE_WAIT_S, leave_group
from kmq_dagster.kafka.group_offsets import read_committed
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: Seconds between two looks at the group's events (rebalances) by the keep-alive thread.
KEEP_ALIVE_S = 0.05


class GroupLease:
    """Hold ``group``'s partitions of ``topics`` while the lease is open.

    The lease joins the group on the first :meth:`wait_for_partitions` (or :meth:`join`), not
    when it is made: a job that does not start (e.g. its group's circuit breaker is open)
    never joins, and so never holds up the group's rebalances by joining and leaving.
    """

    def __init__(self, settings: KmqSettings, topics: Sequence[str], group: str) -> None:
        self.group = group
        self.client_errors = ClientErrors()
        self._topics = list(topics)
        self._lock = threading.Lock()
        self._owned: set[tuple[str, int]] = set()
        self._consumer = new_consumer(
            settings,
            group,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "error_cb": self.client_errors.on_error,
            },
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_membership, daemon=True)

    def join(self) -> None:
        """Join the group (once; later calls do nothing)."""
        if self._thread.is_alive() or self._stop.is_set():
            return
        self._consumer.subscribe(
            self._topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )  # fmt: skip
        self._thread.start()

    def wait_for_partitions(self, timeout_s: float = 60.0) -> bool:
        """Join the group if not yet, and wait until it has given this lease something
        (False on timeout)."""
        self.join()
        deadline = time.monotonic() + timeout_s
        while not self.owned() and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(self.owned())

    def owned(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._owned)

    def committed(self, sources: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offset per partition (0 where none).

        Raises:
            KafkaUnavailableError: the offsets could not be read (never guessed as 0).
        """
        with self._lock:
            found = read_committed(self._consumer, sources, timeout_s=30)
        return {source: offset or 0 for source, offset in found.items()}

    def commit(self, offsets: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
        """Commit offsets of partitions still owned; returns those no longer owned (skipped)."""
        with self._lock:
            owned = set(self._owned)
            mine = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in owned]
            lost = [source for source in offsets if source not in owned]
            if mine:
                try:
                    self._consumer.commit(offsets=mine, asynchronous=False)
                except KafkaException as exc:
                    log.warning("commit refused (partitions moved?): %s", exc)
                    return list(offsets)
        return lost

    def close(self) -> None:
        """Leave the group (its rebalance served before the client closes: see
        kafka/group_exit.py) and close the client."""
        self._stop.set()
        joined = self._thread.is_alive()
        if joined:
            self._thread.join(10)
        with self._lock:
            if joined:
                leave_group(self._consumer, LEAVE_WAIT_S, lambda: bool(self._owned))
            self._consumer.close()

    def _keep_membership(self) -> None:
        while not self._stop.is_set():
            # poll(0) serves rebalances (the partitions stay paused) without waiting: the lock
            # is held for microseconds, so a batch's committed() and commit() never queue
            # behind it (a 0.2 s poll under the lock cost a batch ~250 ms, measured).
            with self._lock:
                self._consumer.poll(0)
            self._stop.wait(KEEP_ALIVE_S)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # the lease owns; Spark tasks read
        self._owned |= {(p.topic, p.partition) for p in partitions}
        log.info("lease of %s got %d partitions", self.group, len(partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._owned -= {(p.topic, p.partition) for p in partitions}
        log.info("lease of %s lost %d partitions", self.group, len(partitions))
