"""kmq's group members leave their group before closing their client, against the real broker.

A close that serves a rebalance can freeze the whole process in librdkafka 2.16 when the
group subsystem terminates first (kafka/group_exit.py). The race itself cannot be staged on
demand; what these tests hold is the condition that rules it out: by the time the client's
``close()`` runs, the group has taken the lease's partitions back, so the close serves no
rebalance callback at all. Without the leave, every close of a member holding partitions
serves its revoke inside ``close()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kmq_dagster.kafka import clients
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.group_lease import GroupLease
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, poll_until, produce, running_service, wait_for

pytestmark = pytest.mark.kafka

Rebalanced = Callable[[Consumer, list[TopicPartition]], None]


class CloseWatchingConsumer(Consumer):
    """A real consumer that notes which rebalance callbacks ran inside its ``close()``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.closing = False
        self.served: list[str] = []
        self.served_in_close: list[str] = []

    def subscribe(
        self,
        topics: list[str],
        on_assign: Rebalanced | None = None,
        on_revoke: Rebalanced | None = None,
        on_lost: Rebalanced | None = None,
    ) -> None:
        def watched(name: str, callback: Rebalanced) -> Rebalanced:
            def call(consumer: Consumer, partitions: list[TopicPartition]) -> None:
                (self.served_in_close if self.closing else self.served).append(name)
                callback(consumer, partitions)

            return call

        given = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        # The client refuses None: only the callbacks given are passed on.
        callbacks = {name: watched(name, cb) for name, cb in given.items() if cb is not None}
        super().subscribe(topics, **callbacks)

    def close(self) -> None:
        self.closing = True
        super().close()


@pytest.fixture
def watched_consumers(monkeypatch: pytest.MonkeyPatch) -> list[CloseWatchingConsumer]:
    """Every consumer kmq makes during the test, watched."""
    made: list[CloseWatchingConsumer] = []

    def make(config: dict[str, Any]) -> CloseWatchingConsumer:
        consumer = CloseWatchingConsumer(config)
        made.append(consumer)
        return consumer

    monkeypatch.setattr(clients, "Consumer", make)
    return made


def subscribed(consumers: list[CloseWatchingConsumer]) -> list[CloseWatchingConsumer]:
    return [c for c in consumers if c.served or c.served_in_close]


def test_a_tracker_stopping_as_its_group_rebalances_closes_with_no_rebalance_to_serve(
    settings: KmqSettings, topic_name: str, watched_consumers: list[CloseWatchingConsumer]
) -> None:
    # given two trackers sharing a queue's two markers partitions
    queue = new_queue(settings, topic_name, partitions=2)
    first, second = RedeliveryTracker(queue), RedeliveryTracker(queue)
    with running_service(first):
        assert wait_for(lambda: first.owned_partitions() == [0, 1], timeout_s=60)
        with running_service(second):
            assert wait_for(
                lambda: len(first.owned_partitions()) == len(second.owned_partitions()) == 1,
                timeout_s=60,
            )
        # when the second stops (the group rebalances) and the first stops right after
    # then each lease's revoke was served before its client closed, none inside the close
    leases = subscribed(watched_consumers)
    assert len(leases) == 2
    for lease in leases:
        assert lease.served_in_close == []
        assert "on_revoke" in lease.served


def test_the_spark_drivers_lease_closes_with_no_rebalance_to_serve(
    settings: KmqSettings, topic_name: str, watched_consumers: list[CloseWatchingConsumer]
) -> None:
    # given a driver's lease holding both partitions of a queue
    queue = new_queue(settings, topic_name, partitions=2)
    lease = GroupLease(settings, queue.queue.consumed_topics, queue.queue.group)
    assert lease.wait_for_partitions()
    # when it closes
    lease.close()
    # then its partitions went back to the group before its client closed
    (watched,) = subscribed(watched_consumers)
    assert watched.served_in_close == []
    assert "on_revoke" in watched.served
    assert not lease.owned()


def test_a_worker_consumer_closes_with_no_rebalance_to_serve_and_hands_on_what_it_did_not_take(
    settings: KmqSettings, topic_name: str, watched_consumers: list[CloseWatchingConsumer]
) -> None:
    # given a consumer that took one batch of 20 messages and acknowledged it, with the rest
    # fetched ahead into the client's queue
    queue = new_queue(settings, topic_name)
    produce(settings, queue.topic, [f"m{i}".encode() for i in range(20)])
    first = KmqConsumer(queue, batch_size=5)
    taken = poll_until(first, 5, timeout_s=60)
    assert len(taken) == 5
    for message in taken:
        first.ack(message)
    # when it closes
    first.close()
    # then the group took its partitions back before the client closed
    (watched,) = subscribed(watched_consumers)
    assert watched.served_in_close == []
    assert "on_revoke" in watched.served
    # and the next member of the group gets every message the first did not take
    second = KmqConsumer(queue, batch_size=20)
    try:
        rest = poll_until(second, 20 - len(taken), timeout_s=60)
    finally:
        second.close()
    assert sorted(m.offset for m in rest) == list(range(len(taken), 20))
