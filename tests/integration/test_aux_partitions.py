"""A queue whose redelivery, retry and dead-letter topics have fewer partitions than the queue
(the default: half) works end to end on the real broker: a message of any queue partition is
redelivered, retried, dead-lettered and replayed, its copies folded into the smaller topics."""

from __future__ import annotations

import collections

import pytest
from confluent_kafka import Message

from kmq_dagster.core.headers import DLQ_REASON, header_value, normalize_headers
from kmq_dagster.core.replay import REPLAY_COUNT
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import (
    LONGEST_WAIT_S,
    new_queue,
    poll_until,
    produce,
    read_topic,
    running_service,
    running_worker,
    wait_for,
)
from tests.mock_cluster import mock_selected

pytestmark = pytest.mark.kafka

PARTITIONS = 4
AUX = 2  # the default for 4: half, rounded up


class Down(RuntimeError):
    pass


@pytest.mark.skipif(mock_selected(), reason="the mock cluster gives every topic 4 partitions")
def test_copies_fold_into_the_smaller_auxiliary_topics_and_nothing_is_lost(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a queue of 4 partitions with the default auxiliary count (2), one retry, one
    # redelivery allowed
    opened = new_queue(settings, topic_name, partitions=PARTITIONS, retry_delays_ms=(500,),
                       visibility_timeout_ms=1_000, max_redeliveries=1)  # fmt: skip
    queue = opened.queue
    counts = partition_counts(settings)
    assert counts[queue.markers_topic] == PARTITIONS
    assert [counts[name] for name in (queue.redelivery_topic, *queue.retry_topics.values(),
                                      queue.dlq_topic)] == [AUX] * 3  # fmt: skip

    # and a message on each queue partition taken and never acknowledged (the tracker will
    # redeliver them), then one more on each partition
    taken_values = [f"a{p}".encode() for p in range(PARTITIONS)]
    produce(settings, queue.topic, taken_values, partitions=PARTITIONS)
    consumer = KmqConsumer(opened)
    try:
        taken = poll_until(consumer, PARTITIONS, timeout_s=LONGEST_WAIT_S / 2)
    finally:
        consumer.close()
    assert sorted(m.partition for m in taken) == list(range(PARTITIONS))
    failing_values = [f"b{p}".encode() for p in range(PARTITIONS)]
    produce(settings, queue.topic, failing_values, partitions=PARTITIONS)
    values = taken_values + failing_values

    # when the handler fails until a message is replayed
    calls: list[KmqMessage] = []

    done: collections.Counter[bytes] = collections.Counter()

    def handle(message: KmqMessage) -> None:
        calls.append(message)
        if REPLAY_COUNT not in dict(message.headers):
            raise Down("downstream is down")
        done.update([message.value or b""])

    with (
        running_service(RedeliveryTracker(opened)),
        running_worker(opened, handle),
    ):
        dead = read_topic(settings, queue.dlq_topic, AUX, at_least=len(values), timeout_s=60)
        replay = replay_dead_letters(opened, ReplayRequest())
        assert replay.replayed == len(values)
        assert wait_for(lambda: sorted(done) == sorted(values), timeout_s=60), done

    # then every copy is in the auxiliary partition its queue partition folds into (p mod 2):
    # the tracker's redeliveries of the taken ones, the retries of all, the dead letters
    def folded(records: list[Message]) -> list[tuple[bytes | None, int | None]]:
        return sorted((r.value(), r.partition()) for r in records)

    def expected(sent: list[bytes]) -> list[tuple[bytes | None, int | None]]:
        return sorted((v, int(v[1:]) % AUX) for v in sent)

    # (the redelivery topic holds the tracker's 4 copies and the 8 replayed ones)
    redelivered = read_topic(
        settings, queue.redelivery_topic, AUX, at_least=len(taken_values) + len(values)
    )
    first = [r for r in redelivered if REPLAY_COUNT not in dict(normalize_headers(r.headers()))]
    assert folded(first) == expected(taken_values)
    (retry_topic,) = queue.retry_topics.values()
    assert folded(read_topic(settings, retry_topic, AUX, at_least=len(values))) == expected(values)
    assert folded(dead) == expected(values)
    reasons = {header_value(normalize_headers(r.headers()), DLQ_REASON) for r in dead}
    assert reasons == {b"failed 2 attempts, the last with Down"}
    # and each was handled 3 times (first delivery or redelivery, retry, replayed copy), the
    # replayed copy successfully: nothing lost
    assert done == dict.fromkeys(values, 1)
    assert collections.Counter(m.value for m in calls) == dict.fromkeys(values, 3)
