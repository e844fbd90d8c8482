"""`kmq provision`: the queue's topics are created once; a second run changes nothing."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kmq_dagster.core.naming import (
    dlq_topic,
    markers_topic,
    redelivery_topic,
    retry_topic,
)
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import (
    ConfigError,
    KafkaUnavailableError,
    ProvisionError,
    QueueConflictError,
)
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.provision import provision_queue, provision_topic
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.kafka_helpers import LONGEST_WAIT_S, poll_until, produce, running_service, wait_for
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka


def _partition_counts(settings: KmqSettings) -> dict[str, int]:
    metadata = AdminClient(settings.admin_config()).list_topics(timeout=10)
    return {name: len(info.partitions) for name, info in metadata.topics.items()}


def test_provision_creates_every_topic_of_a_group(settings: KmqSettings, topic_name: str) -> None:
    policy = RetryPolicy.fixed((5_000, 300_000))
    report = provision_queue(
        settings, Queue(topic_name, "billing", partitions=3, retry_policy=policy)
    )

    # no delay queue unless asked for (provision_queue(..., delay_queue=True))
    expected = [
        topic_name,
        markers_topic(topic_name, "billing"),
        redelivery_topic(topic_name, "billing"),
        retry_topic(topic_name, "billing", 5_000),
        retry_topic(topic_name, "billing", 300_000),
        dlq_topic(topic_name, "billing"),
    ]
    assert report.created == expected
    assert f"{topic_name}.billing.retry.5m" in expected
    # the queue and its markers with the queue's count; redelivery, retry topics and DLQ with
    # the auxiliary count, half the queue's rounded up by default
    counts = _partition_counts(settings)
    assert {name: counts.get(name) for name in expected} == {
        name: 3 if name in expected[:2] else 2 for name in expected
    }


def test_cli_provision_twice_changes_nothing_the_second_time(
    settings: KmqSettings, topic_name: str
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    args = ("provision", "--topic", topic_name, "--partitions", "2", "--group", "g1")

    first = run_kmq(*args, env=env)
    before = _partition_counts(settings)
    second = run_kmq(*args, env=env)

    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr  # the default visibility timeout, 30 s
    # the queue, markers, redelivery, 3 retries, the DLQ (no delay queue without --delays)
    assert first.stdout.count("created ") == 7
    assert second.returncode == 0, second.stderr
    assert "nothing to change: all 7 topics already exist with 2 partitions" in second.stdout
    assert _partition_counts(settings) == before


def test_a_visibility_timeout_under_a_second_is_provisioned_with_a_warning_and_logged_by_workers(
    settings: KmqSettings, topic_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}

    result = run_kmq("provision", "--topic", topic_name, "--partitions", "1", "--group", "g",
                     "--visibility-timeout", "200ms", env=env)  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "kmq: warning: a visibility timeout of 200ms leaves little time for an acknowledgement "
        "to reach the tracker (tens of ms, seconds on a loaded machine): messages acknowledged "
        "in time may be redelivered; give it a few seconds at least\n"
    )
    assert "provisioned" in result.stdout
    # and a consumer of the queue says so in its log, where a Dagster run or a worker shows it
    consumer = KmqConsumer(open_queue(settings, topic_name, "g"))
    consumer.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"queue {topic_name}, group g: a visibility timeout of 200ms" in w
               for w in warnings), warnings  # fmt: skip


def test_a_second_group_adds_only_its_own_topics(settings: KmqSettings, topic_name: str) -> None:
    provision_queue(settings, Queue(topic_name, "a", partitions=2))

    report = provision_queue(settings, Queue(topic_name, "b"))

    assert report.partitions == 2  # adopted from the existing queue topic
    assert report.unchanged == [topic_name]
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
    with pytest.raises(ProvisionError, match="markers has 1, needs 3"):
        provision_queue(settings, Queue(topic_name, "g", partitions=3))


def test_partition_count_other_than_the_existing_queue_is_refused(
    settings: KmqSettings, topic_name: str
) -> None:
    provision_topic(settings, topic_name, partitions=2)
    with pytest.raises(ProvisionError, match="exists with 2 partitions, not 4"):
        provision_topic(settings, topic_name, partitions=4)


def test_a_new_queue_needs_a_partition_count(settings: KmqSettings, topic_name: str) -> None:
    with pytest.raises(ProvisionError, match="give a partition count"):
        provision_queue(settings, Queue(topic_name, "g"))


def test_a_group_name_that_makes_an_illegal_topic_is_refused(
    settings: KmqSettings, topic_name: str
) -> None:
    with pytest.raises(ConfigError, match="illegal topic name"):
        provision_queue(settings, Queue(topic_name, "has space", partitions=1))
    assert topic_name not in _partition_counts(settings)


def test_queues_whose_names_would_share_topics_are_refused(
    settings: KmqSettings, topic_name: str
) -> None:
    # given queue "<t>.b" worked by group "c": its topics are "<t>.b.c.*"
    first = Queue(f"{topic_name}.b", "c", partitions=1)
    provision_queue(settings, first)
    before = _partition_counts(settings)

    # when queue "<t>" with group "b.c" (the same "<t>.b.c.*" names) is provisioned or opened
    result = run_kmq(
        "provision", "-t", topic_name, "-p", "1", "-g", "b.c",
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip

    # then both refuse with one line naming the owner, and nothing is created
    assert result.returncode == 1, result.stdout
    assert result.stderr.count("\n") == 1
    assert f"of queue {topic_name}.b / c" in result.stderr
    assert f"{topic_name}.b.c.markers" in result.stderr
    assert _partition_counts(settings) == before
    with pytest.raises(QueueConflictError, match=f"queue {topic_name}.b / c"):
        open_queue(settings, topic_name, "b.c")
    # and a queue topic named like another queue's DLQ is refused too
    with pytest.raises(QueueConflictError, match="dlq"):
        provision_topic(settings, first.dlq_topic, partitions=1)


def test_the_definition_is_stored_and_contradictions_are_errors(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a queue provisioned with its own retry policy and timeouts
    policy = RetryPolicy.fixed((2_000, 7_000))
    defined = Queue(topic_name, "g", partitions=2, retry_policy=policy, visibility_timeout_ms=9_000,
                    max_redeliveries=5)  # fmt: skip
    provision_queue(settings, defined)

    # when it is opened by name, the stored definition comes back
    opened = open_queue(settings, topic_name, "g")
    assert opened.queue == defined.replace(aux_partitions=1)  # the default: half of 2
    assert (opened.settings, opened.partitions) == (settings, 2)

    # and a value that contradicts it is an error, not a silent override
    with pytest.raises(QueueConflictError, match=r"visibility timeout 9s \(given: 10s\)"):
        open_queue(settings, topic_name, "g", visibility_timeout_ms=10_000)
    with pytest.raises(QueueConflictError, match=r"retry delays 2s,7s \(given: retry delays 2s\)"):
        provision_queue(settings, defined.replace(retry_policy=RetryPolicy.fixed((2_000,))))
    # while agreeing values and the caller's own fatal error types are fine
    fatal = policy.with_non_retryable(["ValueError"])
    assert open_queue(settings, topic_name, "g", retry_policy=fatal).queue.retry_policy == fatal

    # and redefining is explicit: new retry topics are created, the definition replaced
    report = provision_queue(
        settings, defined.replace(retry_policy=RetryPolicy.fixed((3_000,))), redefine=True
    )
    assert report.created == [f"{topic_name}.g.retry.3s"]
    assert open_queue(settings, topic_name, "g").queue.retry_policy.delays_ms == (3_000,)


def test_a_queue_that_was_never_provisioned_says_how_to_provision_it(
    settings: KmqSettings, topic_name: str
) -> None:
    with pytest.raises(ProvisionError, match=f"run `kmq provision --topic {topic_name} --group g`"):
        open_queue(settings, topic_name, "g")


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
        provision_topic(
            KmqSettings(bootstrap_servers=address, request_timeout_ms=1000), "x", partitions=1
        )


def test_dead_letters_are_kept_for_ever_and_retries_past_their_delay(
    settings: KmqSettings, topic_name: str
) -> None:
    from confluent_kafka.admin._config import ConfigResource

    queue = Queue(
        topic_name, "g", partitions=1, retry_policy=RetryPolicy.fixed((1_000, 10 * 86_400_000))
    )
    provision_queue(settings, queue, min_insync_replicas=1, delay_queue=True)

    admin = AdminClient(settings.admin_config())

    def config(topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = admin.describe_configs([resource])[resource].result()
        return {name: entry.value for name, entry in entries.items()}

    assert config(queue.dlq_topic)["retention.ms"] == "-1"
    assert config(f"{topic_name}.delay.dlq")["retention.ms"] == "-1"
    assert config(queue.retry_topics[1_000])["retention.ms"] == str(7 * 86_400_000)
    assert config(queue.retry_topics[10 * 86_400_000])["retention.ms"] == str(20 * 86_400_000)
    assert config(queue.markers_topic)["min.insync.replicas"] == "1"


def test_components_given_an_opened_queue_never_read_the_registry_again(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a queue opened from a registry topic of its own, which is then deleted (a group of
    # its own too: members of a shared group on other tests' topics join and leave, and each
    # of their rebalances delays this consumer's join)
    private = settings.with_overrides(registry_topic=f"_kmq_queues.{topic_name}")
    group = f"g-{topic_name[-8:]}"
    queue = Queue(topic_name, group, partitions=1)
    opened = provision_queue(private, queue, delay_queue=False).opened
    assert open_queue(private, topic_name, group) == opened
    admin = AdminClient(private.admin_config())
    admin.delete_topics([private.registry_topic])[private.registry_topic].result(timeout=30)
    assert wait_for(lambda: private.registry_topic not in _partition_counts(private))
    with pytest.raises(QueueConflictError, match="has no stored definition"):
        open_queue(private, topic_name, group)  # opening again would fail now

    # when a consumer, a tracker and a worker are built from the handle, they work: none of
    # them checks the queue against the registry again
    produce(private, topic_name, [b"m"])
    consumer = KmqConsumer(opened)
    try:
        (message,) = poll_until(consumer, 1, timeout_s=LONGEST_WAIT_S / 2)
        consumer.ack(message)
    finally:
        consumer.close()
    with running_service(RedeliveryTracker(opened)) as tracker:
        assert wait_for(lambda: tracker.owned_partitions() == [0])
    worker = Worker(opened.with_non_retryable(["ValueError"]), lambda message: None)
    assert worker.router.policy.non_retryable == frozenset({"ValueError"})
    worker.consumer.close()
