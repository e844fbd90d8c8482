"""Delay queue on the real broker: delivered when due, never before, nothing lost under SIGKILL."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer

from kmq_dagster.core.delay import DELAY_LEVELS_MS, HOP_DUE_MS
from kmq_dagster.core.headers import DLQ_REASON, header_value, normalize_headers
from kmq_dagster.core.naming import delay_dlq_topic, delay_topic, delay_topics
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.errors import ConfigError, ProvisionError
from kmq_dagster.kafka.delay_forwarder import DelayForwarder
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.kafka.provision import provision_queue, provision_topic
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, read_topic, running_service, running_worker, wait_for
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

PARTITIONS = 2
REPO_ROOT = Path(__file__).resolve().parents[2]


def _due_ms(record: Message) -> int:
    return int(header_value(normalize_headers(record.headers()), DUE_MS) or b"0")


def _delivered_at_ms(record: Message) -> int:
    # The forwarder's producer stamps CreateTime when it delivers: that is the delivery time.
    return record.timestamp()[1]


def _distinct(records: list[Message]) -> int:
    return len({r.value() for r in records})


def test_messages_arrive_when_due_with_key_value_and_headers_kept(
    settings: KmqSettings, topic_name: str
) -> None:
    provision_topic(settings, topic_name, partitions=PARTITIONS, delay_queue=True)
    producer = KmqProducer(settings)
    delays_s = [1, 1.5, 3, 6, 2.2, 1, 4]

    with running_service(DelayForwarder(settings, topic_name)) as forwarder:
        assert wait_for(forwarder.assignment_ready, timeout_s=60)
        sent_at_ms = time.time_ns() // 1_000_000
        for i, delay_s in enumerate(delays_s):
            producer.send(
                topic_name, f"v{i}", key=f"k{i}", headers={"trace": f"t{i}"}, delay=delay_s
            )
        producer.send(topic_name, "now", key="k-now")  # no delay: straight to the topic
        assert producer.flush() == 0
        records = read_topic(settings, topic_name, PARTITIONS, at_least=len(delays_s) + 1)
        delayed = [r for r in records if r.key() != b"k-now"]

    assert len(delayed) == len(delays_s)
    assert forwarder.stats.delivered == len(delays_s)
    for record in delayed:
        index = int((record.key() or b"k0")[1:])
        headers = dict(normalize_headers(record.headers()))
        assert record.value() == f"v{index}".encode()
        assert headers["trace"] == f"t{index}".encode()
        assert HOP_DUE_MS not in headers
        assert _due_ms(record) >= sent_at_ms + delays_s[index] * 1000
        assert _delivered_at_ms(record) >= _due_ms(record), "delivered before its due time"
        assert _delivered_at_ms(record) - _due_ms(record) < 1_000


def test_cli_send_with_delay_is_not_delivered_before_it_is_due(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_SESSION_TIMEOUT_MS": "6000"}
    provisioned = run_kmq("provision", "--topic", topic_name, "-p", "1", "--delays", env=env)
    assert provisioned.returncode == 0, provisioned.stderr
    log = (tmp_path / "delayer.log").open("wb")
    delayer = subprocess.Popen(
        kmq_argv("delayer", "--topic", topic_name),
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # a first message delayed by 1 s shows the delayer is in its group and delivering
        probe = run_kmq("send", "--topic", topic_name, "--delay", "1s", "--value", "probe", env=env)
        assert probe.returncode == 0, probe.stderr
        assert [r.value() for r in read_topic(settings, topic_name, 1, at_least=1)] == [b"probe"]
        sent = run_kmq("send", "--topic", topic_name, "--delay", "5s", "--value", "later", env=env)
        sent_at = time.monotonic()
        assert sent.returncode == 0, sent.stderr
        assert "sent 1 message to" in sent.stdout and "due in 5s" in sent.stdout

        early = read_topic(settings, topic_name, 1, timeout_s=2)
        assert time.monotonic() - sent_at < 4.5
        assert [r.value() for r in early] == [b"probe"], "a delayed message arrived early"
        arrived = read_topic(settings, topic_name, 1, at_least=2, timeout_s=20)
        assert [r.value() for r in arrived] == [b"probe", b"later"]
        assert all(_delivered_at_ms(r) >= _due_ms(r) for r in arrived)
    finally:
        delayer.send_signal(signal.SIGTERM)
        assert delayer.wait(timeout=60) == 0
    assert "kmq delayer: stopped after 2 deliveries" in (tmp_path / "delayer.log").read_text()


@pytest.mark.slow
def test_a_sigkilled_forwarder_loses_no_delayed_message(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    count = 3_000
    provision_topic(settings, topic_name, partitions=PARTITIONS, delay_queue=True)
    env = {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": "6000",
    }
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / f"delayer-{len(processes)}.log").open("wb")
        process = subprocess.Popen(
            kmq_argv("delayer", "--topic", topic_name),
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes.append(process)
        return process

    try:
        # the forwarder first, then the messages: however long it takes to start on a loaded
        # machine, they are due over the 25 s after they are sent, so the kill below lands
        # while most still wait
        first = start()
        assert wait_for(lambda: b"started" in (tmp_path / "delayer-0.log").read_bytes(), 120)
        producer = KmqProducer(settings)
        for i in range(count):
            producer.send(topic_name, str(i), key=str(i), delay=1 + (i % 7) * 4)
        assert producer.flush() == 0
        # kill it once it delivers: messages are being moved between levels, held and delivered
        assert wait_for(lambda: len(read_topic(settings, topic_name, PARTITIONS, timeout_s=1)) > 0)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        delivered_before = len(read_topic(settings, topic_name, PARTITIONS, timeout_s=2))
        assert 0 < delivered_before < count, "the kill must land mid-way"
        second = start()
        deadline = time.monotonic() + 90
        records = read_topic(settings, topic_name, PARTITIONS, timeout_s=5)
        while _distinct(records) < count and time.monotonic() < deadline:
            time.sleep(1)
            records = read_topic(settings, topic_name, PARTITIONS, timeout_s=5)
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    seen = collections.Counter(int(r.value() or b"-1") for r in records)
    missing = set(range(count)) - set(seen)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    print(f"delivered before kill {delivered_before}, duplicates {duplicates}")
    assert not missing, f"{len(missing)} delayed messages lost, e.g. {sorted(missing)[:5]}"
    assert all(_delivered_at_ms(r) >= _due_ms(r) for r in records), "delivered early"


def test_garbage_on_a_level_topic_goes_to_the_delay_dlq_and_the_rest_flows(
    settings: KmqSettings, topic_name: str
) -> None:
    provision_topic(settings, topic_name, partitions=1, delay_queue=True)
    raw = Producer(settings.producer_config())
    level = delay_topic(topic_name, 5_000)
    raw.produce(level, value=b"no headers")
    raw.produce(level, value=b"bad due", headers=[(DUE_MS, b"soon"), (HOP_DUE_MS, b"1")])
    raw.produce(
        level, value=b"year 2500", headers=[(DUE_MS, b"16725225600000"), (HOP_DUE_MS, b"1")]
    )
    assert raw.flush(30) == 0
    producer = KmqProducer(settings)
    producer.send(topic_name, "good", delay=1)
    assert producer.flush() == 0

    with running_service(DelayForwarder(settings, topic_name)) as forwarder:
        assert wait_for(forwarder.assignment_ready, timeout_s=60)
        good = read_topic(settings, topic_name, 1, at_least=1)
        dead = read_topic(settings, delay_dlq_topic(topic_name), 1, at_least=3)

    assert [r.value() for r in good] == [b"good"]
    reasons = {
        r.value(): (header_value(normalize_headers(r.headers()), DLQ_REASON) or b"").decode()
        for r in dead
    }
    assert set(reasons) == {b"no headers", b"bad due", b"year 2500"}
    assert all(reason.startswith("corrupt delay metadata: ") for reason in reasons.values())
    assert "more than 7d ahead" in reasons[b"year 2500"]
    assert forwarder.stats.corrupt == 3


def test_bad_delays_and_missing_delay_topics_are_clear_errors(
    settings: KmqSettings, topic_name: str
) -> None:
    producer = KmqProducer(settings)
    provision_topic(settings, topic_name, partitions=1, delay_queue=False)
    with pytest.raises(ConfigError, match="between 1s and 7d"):
        producer.send(topic_name, "x", delay=0.5)
    with pytest.raises(ProvisionError, match=f"run `kmq provision --topic {topic_name} --delays`"):
        producer.send(topic_name, "x", delay=10)

    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    # the delay queue is opt-in: sending with a delay to a topic without it is one clear line,
    # and nothing is sent anywhere (not silently dropped, not delivered at once)
    refused = run_kmq("send", "--topic", topic_name, "--delay", "10s", "--value", "x", env=env)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"kmq: error: {topic_name} has no delay queue")
    assert f"`kmq provision --topic {topic_name} --delays`" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert read_topic(settings, topic_name, 1, timeout_s=5) == []
    delayer = run_kmq("delayer", "--topic", topic_name, env=env)
    assert delayer.returncode == 1
    assert f"`kmq provision --topic {topic_name} --delays`" in delayer.stderr, delayer.stderr
    result = run_kmq("send", "--topic", topic_name, "--delay", "8d", "--value", "x", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == "kmq: error: --delay: '8d' is outside 1s to 7d"


def test_a_queue_provisioned_with_its_delay_queue_keeps_it_when_provisioned_again_without(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a queue provisioned the old way, with its delay queue
    opened = new_queue(settings, topic_name, delay_queue=True)
    ladder = delay_topics(topic_name, DELAY_LEVELS_MS)

    # when it is provisioned again without asking for the delay queue
    report = provision_queue(settings, opened.queue)

    # then nothing is created or deleted, and its delayed messages still arrive and are handled
    assert report.created == [] and not report.changed
    assert set(ladder) <= set(partition_counts(settings))
    handled: list[bytes | None] = []
    with (
        running_service(DelayForwarder(settings, topic_name)) as forwarder,
        running_worker(report.opened, lambda message: handled.append(message.value)),
    ):
        assert wait_for(forwarder.assignment_ready, timeout_s=60)
        producer = KmqProducer(settings)
        producer.send(topic_name, "later", delay=1)
        assert producer.flush() == 0
        assert wait_for(lambda: handled == [b"later"], timeout_s=60), handled
    assert forwarder.stats.delivered == 1
