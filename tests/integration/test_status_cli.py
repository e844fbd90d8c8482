"""`kmq status`: per queue and group, what a person needs to see (and JSON for scripts)."""

from __future__ import annotations

import json

import pytest

from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce, produce_dead_letters
from tests.support.kmq_cli import KmqCli

pytestmark = pytest.mark.kafka


def test_status_shows_lag_in_flight_and_dead_letters_of_each_group(
    settings: KmqSettings, topic_name: str, group: str, kmq_cli: KmqCli
) -> None:
    # given 10 messages: group "a" holds 4 of them in flight, group "b" never read any
    group_a, group_b = f"{group}-a", f"{group}-b"  # the test's own groups
    a = new_queue(settings, topic_name, group_a, partitions=1)
    new_queue(settings, topic_name, group_b, partitions=1)
    produce(settings, topic_name, [str(i).encode() for i in range(10)])
    produce_dead_letters(settings, a, [("x", "TimeoutError")])
    consumer = KmqConsumer(a, batch_size=4)
    try:
        held: list[object] = []
        while len(held) < 4:
            held += consumer.poll(timeout_s=0.5)
        consumer.flush()  # start markers durable, offsets committed

        # when status is asked for both groups, as JSON
        printed = kmq_cli.ok("status", "-t", topic_name, "--json")
        by_group = {row["group"]: row for row in map(json.loads, printed.split("\n")[:-1])}

        # and as a table for one group
        table = kmq_cli.ok("status", "-t", topic_name, "-g", group_a).splitlines()
    finally:
        consumer.close()

    row_a, row_b = by_group[group_a], by_group[group_b]
    assert (row_a["lag"], row_a["inflight"], row_a["dlq_depth"]) == (6, 4, 1)
    assert row_a["oldest_unacked_age_ms"] is not None
    assert (row_b["lag"], row_b["inflight"], row_b["dlq_depth"]) == (10, 0, 0)
    assert table[0].split() == ["QUEUE", "GROUP", "LAG", "IN", "FLIGHT", "OLDEST", "UNACKED",
                                "RETRIES", "DLQ", "BREAKER", "PARTITIONS"]  # fmt: skip
    assert table[1].split()[:4] == [topic_name, group_a, "6", "4"]
    # the queue's footprint: the queue topic, and a's markers, redelivery, 3 retry topics and
    # DLQ (provisioned without the delay queue), 1 partition each; b's topics are b's
    assert table[1].split()[-4:] == ["7", "in", "7", "topics"]
    assert row_a["topic_partitions"] == 7
    assert row_a["topics"] == [topic_name, *a.queue.group_topics]
    kmq_cli.fails("status", "-t", f"{topic_name}-nothing")


def test_status_shows_how_many_topics_and_partitions_a_queue_holds(
    settings: KmqSettings, topic_name: str, kmq_cli: KmqCli
) -> None:
    # given a queue of 3 partitions with its delay queue, and a second group's
    new_queue(settings, topic_name, "a", partitions=3, delay_queue=True)
    new_queue(settings, topic_name, "b", partitions=3, retry_delays_ms=(1_000,))

    shown = json.loads(kmq_cli.ok("status", "-t", topic_name, "-g", "a", "--json"))
    table = kmq_cli.ok("status", "-t", topic_name, "-g", "a").splitlines()

    # the queue topic, 8 delay levels, the delay DLQ and a's markers with 3 partitions each,
    # a's redelivery, 3 retry topics and DLQ with 2: 16 topics (b's own topics are not a's)
    assert (len(shown["topics"]), shown["topic_partitions"]) == (16, 11 * 3 + 5 * 2)
    assert not any(".b." in name for name in shown["topics"])
    assert table[1].split()[-4:] == ["43", "in", "16", "topics"]

    # when both groups are shown, the topics they share count once (on a's row), so the rows
    # add up to what the queue holds: b's row has only b's own topics, marked with a "+"
    rows = [
        json.loads(line) for line in kmq_cli.ok("status", "-t", topic_name, "--json").splitlines()
    ]
    table = kmq_cli.ok("status", "-t", topic_name).splitlines()
    held = partition_counts(settings)
    counted_topics = [name for row in rows for name in row["topics"]]
    assert sorted(counted_topics) == sorted(name for name in held if topic_name in name)
    assert sum(row["topic_partitions"] for row in rows) == sum(held[n] for n in counted_topics)
    b_topics = rows[1]["topics"]
    assert (rows[1]["group"], rows[1]["shared_topics"]) == ("b", False)
    assert topic_name not in b_topics
    b_cell = [f"+{rows[1]['topic_partitions']}", "in", str(len(b_topics)), "topics"]
    assert table[2].split()[-4:] == b_cell
