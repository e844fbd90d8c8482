"""`kmq provision`: the queue's topics are created once; a second run changes nothing."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kmq_dagster.core.delay import DELAY_LEVELS_MS
from kmq_dagster.core.naming import (
    delay_topics,
    dlq_topic,
    markers_topic,
    redelivery_topic,
    retry_topic,
)
from kmq_dagster.errors import ConfigError, KafkaUnavailableError, ProvisionError
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka


def _partition_counts(settings: KmqSettings) -> dict[str, int]:
    metadata = AdminClient(settings.admin_config()).list_topics(timeout=10)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


def test_provision_creates_every_topic_of_a_group(settings: KmqSettings, topic_name: str) -> None:
    report = provision_queue(
        settings, topic_name, partitions=3, group="billing", retry_delays_ms=(5_000, 300_000)
    )

    expected = [
        topic_name,
        *delay_topics(topic_name, DELAY_LEVELS_MS),
        markers_topic(topic_name, "billing"),
        redelivery_topic(topic_name, "billing"),
        retry_topic(topic_name, "billing", 5_000),
        retry_topic(topic_name, "billing", 300_000),
        dlq_topic(topic_name, "billing"),
    ]
    assert report.created == expected
    assert f"{topic_name}.billing.retry.5m" in expected
    counts = _partition_counts(settings)
    assert {name: counts.get(name) for name in expected} == dict.fromkeys(expected, 3)


def test_cli_provision_twice_changes_nothing_the_second_time(
    settings: KmqSettings, topic_name: str
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    args = ("provision", "--topic", topic_name, "--partitions", "2", "--group", "g1")

    first = run_kmq(*args, env=env)
    before = _partition_counts(settings)
    second = run_kmq(*args, env=env)

    assert first.returncode == 0, first.stderr
    # the queue, 8 delay levels and the delay DLQ, markers, redelivery, 3 retries, the DLQ
    assert first.stdout.count("created ") == 16
    assert second.returncode == 0, second.stderr
    assert "nothing to change: all 16 topics already exist with 2 partitions" in second.stdout
    assert _partition_counts(settings) == before


def test_a_second_group_adds_only_its_own_topics(settings: KmqSettings, topic_name: str) -> None:
    provision_queue(settings, topic_name, partitions=2, group="a")

    report = provision_queue(settings, topic_name, group="b")

    assert report.partitions == 2  # adopted from the existing queue topic
    assert report.unchanged == [topic_name, *delay_topics(topic_name, DELAY_LEVELS_MS)]
    assert all(".b." in name for name in report.created)


def test_markers_topic_with_other_partition_count_is_a_clear_error(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a markers topic someone created by hand with the wrong partition count
    markers = markers_topic(topic_name, "g")
    admin = AdminClient(settings.admin_config())
    admin.create_topics([NewTopic(markers, 1, 1)])[markers].result()

    # when the queue is provisioned with 3 partitions
    result = run_kmq(
        "provision",
        "-t",
        topic_name,
        "-p",
        "3",
        "-g",
        "g",
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )

    # then it fails with one line naming the topic, and creates nothing
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert f"{markers} has 1" in result.stderr
    assert topic_name not in _partition_counts(settings)
    with pytest.raises(ProvisionError, match="same count"):
        provision_queue(settings, topic_name, partitions=3, group="g")


def test_partition_count_other_than_the_existing_queue_is_refused(
    settings: KmqSettings, topic_name: str
) -> None:
    provision_queue(settings, topic_name, partitions=2)
    with pytest.raises(ProvisionError, match="exists with 2 partitions, not 4"):
        provision_queue(settings, topic_name, partitions=4)


def test_a_new_queue_needs_a_partition_count(settings: KmqSettings, topic_name: str) -> None:
    with pytest.raises(ProvisionError, match="give --partitions"):
        provision_queue(settings, topic_name, group="g")


def test_a_group_name_that_makes_an_illegal_topic_is_refused(
    settings: KmqSettings, topic_name: str
) -> None:
    with pytest.raises(ConfigError, match="illegal topic name"):
        provision_queue(settings, topic_name, partitions=1, group="has space")
    assert topic_name not in _partition_counts(settings)


def test_unreachable_broker_is_one_line_not_a_traceback() -> None:
    from kmq_dagster.broker.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    result = run_kmq(
        "provision",
        "-t",
        "x",
        "-p",
        "1",
        env={"KMQ_BOOTSTRAP_SERVERS": address, "KMQ_REQUEST_TIMEOUT_MS": "2000"},
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"kmq: error: cannot reach Kafka at {address}")
    assert "Traceback" not in result.stderr
    with pytest.raises(KafkaUnavailableError):
        provision_queue(
            KmqSettings(bootstrap_servers=address, request_timeout_ms=1000), "x", partitions=1
        )
