"""Which markers partitions a redelivery tracker may redeliver from, and how it commits them.

A tracker reads markers on a consumer it assigns partitions to by hand. Its share of the
markers partitions comes from a second consumer, the lease: the tracker's member of the
tracker group, which fetches nothing (its partitions stay paused) and is polled on the
tracker's own thread, so a rebalance never overlaps a redelivery step.

Joining a group takes seconds: Apache Kafka holds a new group's first join for
``group.initial.rebalance.delay.ms`` (3 s by default), the embedded broker for half the session
timeout. A tracker that finds the tracker group empty (no tracker runs, or the last one left)
does not wait for that. It takes every markers partition at once, *early*, reads each to its
end and redelivers as usual, and when the group gives the lease its share, it keeps the
partitions of that share, state and all, and gives up the rest. A tracker that finds the group
not empty waits for its share, as any member does.

A rebalance takes a tracker's share back before it hands out the next one (the classic, eager
protocol, which every tracker of a group must share). The tracker stops redelivering from the
partitions taken back but keeps reading them, and keeps what it read of those the next share
gives back, from where it got to: a tracker joining the group no longer sends the others back
to their last commit. As with a new partition, it redelivers nothing from a partition given
back before it has read it to its end again (another tracker may have owned it meanwhile).

Two trackers that start within the same instant may both find the group empty and both
redeliver from the same partition until the group has formed (seconds): a message may then be
redelivered twice, which at-least-once allows (docs/design.md, invariant 1); nothing is lost.

Commits go through the lease, and Kafka refuses commits from a member that lost its
generation. An early tracker commits nothing while its lease is joining: Kafka accepts commits
from outside a group only while the group is empty, and the joining lease makes it not
empty. From the group's first share on, positions are committed every second and when a
partition is given up; an early tracker that is stopped waits for that share first, so a
stop in a tracker's first seconds takes as long as the group takes to form.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from kmq_dagster.kafka.clients import kafka_error_text, new_consumer
from kmq_dagster.kafka.group_exit import LEAVE_WAIT_S, leave_group
from kmq_dagster.secrets import mask_text
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: Longest the tracker's start waits to learn whether the group is empty (no answer: join as
#: any member does).
GROUP_LOOK_TIMEOUT_S = 3.0
#: How often the lease tells the group it is alive (and hears of rebalances), at most.
LEASE_HEARTBEAT_MS = 500
#: Seconds a stop waits for the group to form beyond the session timeout.
JOIN_WAIT_MARGIN_S = 10.0
#: Group states that say no tracker is a member.
_NO_MEMBERS = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD})

#: Called with markers partitions the tracker gains, or is about to lose.
PartitionsCallback = Callable[[list[int]], None]


class TrackerLease:
    """The tracker's member of ``group`` on ``markers_topic``.

    Args:
        on_gain: called (on the polling thread) with partitions the tracker may now redeliver
            from; they are new to it.
        on_lose: called with partitions the tracker gives up: it drops what it read of
            them (those it still owns then, taken early, it commits first).
        on_release: called with partitions the group takes back in a rebalance, while the
            tracker may still commit them. The tracker stops redelivering from them but reads
            on: the share the rebalance ends with often gives them back, and then what it read
            is kept (any other tracker owning one meanwhile wrote its end markers to the
            partition the tracker kept reading).
        on_regain: called with partitions taken back by a rebalance that the next share gave
            back: the tracker catches up on them before it redelivers from them again.
    """

    def __init__(
        self,
        settings: KmqSettings,
        group: str,
        markers_topic: str,
        *,
        on_gain: PartitionsCallback,
        on_lose: PartitionsCallback,
        on_release: PartitionsCallback,
        on_regain: PartitionsCallback,
        error_cb: Callable[..., None],
    ) -> None:
        self.group = group
        self.markers_topic = markers_topic
        self._on_gain = on_gain
        self._on_lose = on_lose
        self._on_release = on_release
        self._on_regain = on_regain
        heartbeat = {}
        if "heartbeat.interval.ms" not in settings.client_config:  # else the user's choice
            # A running member hears of a rebalance only at its next heartbeat (librdkafka's
            # default: every 3 s), and the group's next share waits for it. The lease fetches
            # nothing, so its heartbeats are all it sends.
            heartbeat["heartbeat.interval.ms"] = min(
                LEASE_HEARTBEAT_MS, settings.session_timeout_ms // 3
            )
        self._consumer = new_consumer(settings, group, error_cb=error_cb, **heartbeat)
        #: Longest a stop waits for an early tracker's group to form (a first join takes half
        #: the session timeout on the embedded broker, 3 s or more on Apache Kafka).
        self.join_wait_s = settings.session_timeout_ms / 1000 + JOIN_WAIT_MARGIN_S
        #: Partitions taken early, until the group gives its first share.
        self._early: set[int] = set()
        #: The group's share, as of the last rebalance.
        self._share: set[int] = set()
        #: Partitions of the last share taken back by a rebalance that has not ended yet.
        self._suspended: set[int] = set()
        #: Whether the group has given this lease a share (then commits go through it).
        self.member = False
        #: Whether the tracker found the group empty and took every partition at its start.
        self.started_early = False
        #: Whether the group's last assignment has not been revoked yet (even an empty one:
        #: its revoke still comes).
        self._assignment_open = False
        self._closed = False

    @property
    def early(self) -> bool:
        """Whether the tracker holds partitions the group has not given it yet."""
        return bool(self._early)

    def owns(self, partition: int) -> bool:
        """Whether the tracker may redeliver from ``partition`` now."""
        return partition in self._share or partition in self._early

    def start(self, admin: AdminClient) -> None:
        """Take every markers partition early if the group is empty, then join the group."""
        partitions = self._partitions_if_group_empty(admin)
        if partitions:
            self._early = set(partitions)
            self.started_early = True
            log.info(
                "tracker group %s is empty: tracking markers partitions %s before it forms",
                self.group, partitions,
            )  # fmt: skip
            self._on_gain(partitions)
        self._consumer.subscribe(
            [self.markers_topic], on_assign=self._assigned, on_revoke=self._revoked
        )

    def poll(self) -> None:
        """Serve the group's rebalances (on the caller's thread); fetches nothing."""
        self._consumer.poll(0)

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Commit ``offsets`` as a member; before the first share, nothing is accepted, so
        nothing is sent (see :meth:`settle`).

        Raises:
            KafkaException: the group refused the commit.
        """
        if self.member and offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    @property
    def _waiting_for_share(self) -> bool:
        """Started early and not yet given a share by the group: no commit is accepted yet."""
        return self.early and not self.member

    def settle(self) -> None:
        """Before a stop: an early tracker waits (at most :attr:`join_wait_s`) for the group to
        give its first share, so that it can commit as a member (see the module's docstring).
        Partitions the share leaves out are given up, and committed, as they would be later."""
        if self._waiting_for_share:
            log.info(
                "stopping: waiting up to %.0f s for tracker group %s to form, to commit the "
                "markers positions", self.join_wait_s, self.group,
            )  # fmt: skip
        deadline = time.monotonic() + self.join_wait_s
        while self._waiting_for_share and time.monotonic() < deadline:
            self._consumer.poll(0.1)
        if self._waiting_for_share:
            log.warning(
                "tracker group %s did not form within %.0f s: positions not committed; a "
                "restarted tracker re-reads from the last commit", self.group, self.join_wait_s,
            )  # fmt: skip

    def close(self, last_offsets: list[TopicPartition]) -> None:
        """Commit ``last_offsets`` if a member, and leave the group."""
        if self._closed:
            return
        self._closed = True
        if self.member:
            try:
                self.commit(last_offsets)
            except KafkaException as exc:  # a lost commit only means a longer re-read
                log.warning("markers commit failed: %s", exc)
        # Leave first, so that the close serves no rebalance (kafka/group_exit.py says why).
        # Its revoke hands nothing to the tracker: the positions were committed just above.
        leave_group(self._consumer, LEAVE_WAIT_S, lambda: self._assignment_open)
        # Should the client hang in its close all the same while letting go of the GIL, the
        # close gets a thread and a deadline (a hang holding the GIL stops every thread, this
        # one too: what the leave is for).
        closer = threading.Thread(target=self._consumer.close, name="kmq-lease-close", daemon=True)
        closer.start()
        closer.join(self.join_wait_s)
        if closer.is_alive():
            log.warning(
                "the tracker's member of group %s did not leave within %.0f s (the Kafka "
                "client hung in its last rebalance); stopping without it: the group drops it "
                "after its session timeout", self.group, self.join_wait_s,
            )  # fmt: skip

    def _partitions_if_group_empty(self, admin: AdminClient) -> list[int]:
        try:
            described = admin.describe_consumer_groups([self.group])[self.group]
            state = described.result(timeout=GROUP_LOOK_TIMEOUT_S).state
            if state not in _NO_MEMBERS:
                return []
            topics = admin.list_topics(self.markers_topic, timeout=GROUP_LOOK_TIMEOUT_S).topics
            metadata = topics.get(self.markers_topic)
        except Exception as exc:  # no answer in time, no right to describe groups, ...
            reason = mask_text(kafka_error_text(exc))
            log.info("tracker group %s not looked at (%s): joining it first", self.group, reason)
            return []
        if metadata is None or metadata.error is not None:
            return []  # the topic watch reports a missing markers topic
        return sorted(metadata.partitions)

    def _assigned(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        consumer.assign(assigned)
        consumer.pause(assigned)  # the lease owns; the tracker's reader reads
        self._assignment_open = True
        if self._closed:
            return  # a share that arrives while leaving: the tracker has stopped
        share = {tp.partition for tp in assigned}
        self.member = True
        held = self._early | self._suspended
        kept = held & share
        given_up = sorted(held - kept)
        if given_up:
            self._on_lose(given_up)  # early ones are still owned here: committed first
        regained = sorted(self._suspended & share)
        self._early, self._suspended, self._share = set(), set(), share
        if regained:
            self._on_regain(regained)
        gained = sorted(share - kept)
        if gained:
            self._on_gain(gained)
        log.info("tracking markers partitions %s (the group's share)", sorted(share))

    def _revoked(self, _consumer: Consumer, revoked: list[TopicPartition]) -> None:
        self._assignment_open = False
        if self._closed:
            return  # leaving: committed already, and the tracker is done with them
        partitions = [tp.partition for tp in revoked]
        self._on_release(partitions)  # still owned: committed while the generation holds
        self._share -= set(partitions)
        # Kept and read on, not redelivered from, until the next share says whose they are.
        self._suspended |= set(partitions)
