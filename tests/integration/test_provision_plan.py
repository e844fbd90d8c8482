"""`kmq provision --plan`: every topic provisioning would create, with its partitions,
replication and settings and the partition totals, read from the broker; nothing is created."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from kmq_dagster.cli import main
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings

pytestmark = pytest.mark.kafka


def _partition_counts(settings: KmqSettings) -> dict[str, int]:
    metadata = AdminClient(settings.admin_config()).list_topics(timeout=10)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


@pytest.fixture(autouse=True)
def _bootstrap(settings: KmqSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KMQ_BOOTSTRAP_SERVERS", settings.bootstrap_servers)


def test_the_plan_names_what_provisioning_then_creates_and_creates_nothing_itself(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a new queue of 3 partitions with a two-step retry policy and the delay queue
    args = ["provision", "-t", topic_name, "-g", "pricing", "-p", "3", "--retry-delays", "5s,2h",
            "--delays"]  # fmt: skip
    before = _partition_counts(settings)

    # when it is planned, as JSON
    assert main([*args, "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)

    # then no topic appeared on the broker
    assert _partition_counts(settings) == before
    # and the plan lists the queue, 8 delay levels, the delay DLQ and markers, each new with 3
    # partitions, and redelivery, two retry topics and the DLQ with 2 (half of 3, rounded up),
    # all with the cluster's replication
    own = [t for t in plan["topics"] if t["topic"] != settings.registry_topic]
    aux = {f"{topic_name}.pricing.{name}" for name in ("redelivery", "retry.5s", "retry.2h", "dlq")}
    assert len(own) == 15 and plan["queue_topics"] == 15
    assert plan["queue_partitions"] == 11 * 3 + 4 * 2 and plan["aux_partitions"] == 2
    assert all((t["exists"], t["partitions"], t["replication_factor"])
               == (False, 2 if t["topic"] in aux else 3, -1) for t in own)  # fmt: skip
    configs = {t["topic"]: t["config"] for t in own}
    assert configs[f"{topic_name}.pricing.dlq"] == {"retention.ms": "-1"}
    assert configs[f"{topic_name}.pricing.retry.2h"] == {"retention.ms": str(7 * 86_400_000)}
    assert configs[f"{topic_name}.pricing.markers"] == {}
    # and the definitions topic: in the plan as provisioning finds it (other tests made it)
    (registry,) = [t for t in plan["topics"] if t["topic"] == settings.registry_topic]
    assert registry["exists"] is (settings.registry_topic in before)
    assert plan["create_partitions"] == 41 + (0 if registry["exists"] else 1)
    assert plan["stores_definition"] is True

    # when the queue is provisioned as planned, it creates exactly the planned topics
    policy = RetryPolicy.fixed((5_000, 7_200_000))
    queue = Queue(topic_name, "pricing", 3, retry_policy=policy)
    report = provision_queue(settings, queue, delay_queue=True)
    assert report.created == [t["topic"] for t in own]
    after = _partition_counts(settings)
    assert sum(after[t["topic"]] for t in own) == plan["queue_partitions"]


def test_the_plan_of_a_second_group_keeps_the_shared_topics_and_counts_only_new_ones(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a queue of 2 partitions provisioned for group "a"
    provision_queue(settings, Queue(topic_name, "a", partitions=2))
    before = _partition_counts(settings)

    # when group "b" is planned (adopting the queue's partitions), and "a" again
    assert main(["provision", "-t", topic_name, "-g", "b", "--plan"]) == 0
    second = capsys.readouterr().out.splitlines()
    assert main(["provision", "-t", topic_name, "-g", "a", "--plan"]) == 0
    again = capsys.readouterr().out.splitlines()

    # then the queue topic exists and stays; b's 6 topics would be created, its markers with
    # the queue's 2 partitions, the others with 1
    assert _partition_counts(settings) == before
    assert second[0] == (
        f"plan for queue {topic_name}, group b (2 partitions; redelivery, retry and DLQ topics "
        "1); nothing created"
    )
    rows = {line.split()[1]: line.split() for line in second[1:-2]}
    assert rows[topic_name] == ["keep", topic_name, "exists,", "2", "partitions"]
    assert f"{topic_name}.delay.dlq" not in rows  # no delay queue unless asked for
    assert rows[f"{topic_name}.b.markers"][:4] == ["create", f"{topic_name}.b.markers", "2",
                                                   "partitions"]  # fmt: skip
    assert rows[f"{topic_name}.b.dlq"][:4] == ["create", f"{topic_name}.b.dlq", "1", "partition"]
    settings_words = " ".join(rows[f"{topic_name}.b.dlq"][4:])
    assert settings_words == "replication cluster default retention forever"
    assert rows[settings.registry_topic][0] == "keep"
    assert second[-2:] == [
        "would create 6 topics with 7 partitions; the queue's 7 topics hold 9 partitions",
        "would store the queue's definition in " + settings.registry_topic,
    ]
    # and for "a", provisioned already: nothing would change
    assert all(line.split()[0] == "keep" for line in again[1:-1])
    assert (
        again[-1]
        == "would create 0 topics with 0 partitions; the queue's 7 topics hold 9 partitions"
    )


def test_a_plan_provisioning_would_refuse_is_refused_in_one_line(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    provision_queue(settings, Queue(topic_name, "a", partitions=2))

    assert main(["provision", "-t", topic_name, "-g", "a", "-p", "4", "--plan"]) == 1

    err = capsys.readouterr().err
    assert "exists with 2 partitions, not 4" in err and err.count("\n") == 1, err


def test_a_queue_of_8_partitions_with_3_retries_and_no_delays_is_light_on_the_cluster(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a new queue of 8 partitions, a 3-step retry policy (distinct delays), no --delays
    args = ["provision", "-t", topic_name, "-g", "g", "-p", "8", "--retry-delays", "10s,1m,10m"]

    # when it is planned with the default settings
    assert main([*args, "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)

    # then it has 7 topics of its own (the registry is the cluster's): the queue, markers,
    # redelivery, 3 retry topics and the DLQ
    counts = {t["topic"]: t["partitions"] for t in plan["topics"]}
    counts.pop(settings.registry_topic)
    assert plan["queue_topics"] == len(counts) == 7
    # and its auxiliary topics hold at most 4x the queue's partitions: the markers the
    # queue's 8, the five others 4 each
    aux = {name: n for name, n in counts.items() if name != topic_name}
    assert aux.pop(f"{topic_name}.g.markers") == 8
    assert list(aux.values()) == [4] * 5
    assert 8 + sum(aux.values()) == 28 <= 4 * 8
    assert plan["queue_partitions"] == 8 + 28

    # and provisioning creates exactly that on the broker
    assert main(args) == 0
    capsys.readouterr()
    after = _partition_counts(settings)
    assert {name: after[name] for name in counts} == counts


def test_the_plan_of_a_topic_without_a_group_lists_only_the_queue_topic_and_its_delay_queue(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a new topic of 3 partitions with a delay queue of two levels, and no group
    args = ["provision", "-t", topic_name, "-p", "3", "--delays", "--delay-levels", "1s,1m"]
    before = _partition_counts(settings)

    # when it is planned
    assert main([*args, "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()

    # then nothing appeared, and the plan names the queue without a group and no group topics:
    # the queue topic, 2 delay levels and the delay DLQ, 3 partitions each
    assert _partition_counts(settings) == before
    assert lines[0] == f"plan for queue {topic_name} (3 partitions); nothing created"
    rows = {line.split()[1]: line.split() for line in lines[1:-2]}
    created = [name for name, row in rows.items() if row[0] == "create"]
    if settings.registry_topic not in before:  # the first provisioning of this broker
        created.remove(settings.registry_topic)
    assert created == [topic_name, f"{topic_name}.delay.1s", f"{topic_name}.delay.1m",
                       f"{topic_name}.delay.dlq"]  # fmt: skip
    assert all(rows[name][2:4] == ["3", "partitions"] for name in created)
    assert set(rows) == {*created, settings.registry_topic}
    new_registry = settings.registry_topic not in before
    assert lines[-2:] == [
        f"would create {4 + new_registry} topics with {12 + new_registry} partitions; "
        "the queue's 4 topics hold 12 partitions",
        "would store the queue's definition in " + settings.registry_topic,
    ]

    # and provisioning creates exactly the planned topics
    assert main(args) == 0
    capsys.readouterr()
    after = _partition_counts(settings)
    assert {name: after[name] for name in created} == dict.fromkeys(created, 3)
