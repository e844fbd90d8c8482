"""`kmq broker`: serves real clients, stops cleanly, keeps its data with --data-dir."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kmq_dagster.bench.fleet import BrokerRun, Fleet
from kmq_dagster.broker.embedded import EmbeddedBroker
from kmq_dagster.broker.ports import free_port
from kmq_dagster.broker.probe import kafka_answers
from kmq_dagster.child_processes import is_running
from kmq_dagster.kafka.provision import provision_topic
from kmq_dagster.kafka.topic_reader import records_and_ends
from kmq_dagster.settings import KmqSettings
from tests.processes import BrokerProcess, run_kmq
from tests.support.port_window import narrow_pick_range

pytestmark = pytest.mark.kafka


def _settings(bootstrap_servers: str) -> KmqSettings:
    return KmqSettings(bootstrap_servers=bootstrap_servers, session_timeout_ms=6_000)


def _read_all(settings: KmqSettings, topic: str, group: str) -> list[bytes | None]:
    """Read ``topic`` in ``group`` from its committed offsets until every partition assigned
    reported its end (a partition-EOF event), then commit what was read."""
    consumer = Consumer(settings.consumer_config(group, **{"enable.partition.eof": True}))
    consumer.subscribe([topic])
    values: list[bytes | None] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while True:
            assert time.monotonic() < deadline, f"{topic} not read to its end within 60 s"
            records = records_and_ends(consumer.consume(100, 0.2), at_end)
            values += [record.value() for record in records]
            assigned = {tp.partition for tp in consumer.assignment()}
            if assigned and assigned <= at_end:
                break
        if values:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_broker_serves_clients_and_stops_on_sigterm_with_children_reaped(tmp_path: Path) -> None:
    broker = BrokerProcess("--port", "0", log_path=tmp_path / "broker.log")
    try:
        children = broker.child_pids()
        settings = _settings(broker.bootstrap_servers)
        provision_topic(settings, "served", partitions=1)
        producer = Producer(settings.producer_config())
        producer.produce("served", value=b"hello")
        assert producer.flush(30) == 0
        assert _read_all(settings, "served", "g") == [b"hello"]
    except BaseException:
        broker.kill()
        raise

    assert children, "the broker runs as a child process"
    broker.stop_expecting(0)
    assert "kmq broker: stopped" in broker.log_path.read_text()
    assert not [pid for pid in children if is_running(pid)]


def test_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_kmq("broker", "--port", str(port))
    assert result.returncode == 1
    # one line, naming what holds the port: this test's own process
    assert result.stderr.startswith(
        f"kmq: error: port {port} on 127.0.0.1 is already in use by pid {os.getpid()} ("
    )
    assert result.stderr.endswith(") (another broker running? pass --port 0 to pick a free port)\n")
    assert result.stderr.count("\n") == 1


def test_missing_broker_binary_is_a_one_line_error(tmp_path: Path) -> None:
    result = run_kmq(
        "broker", "--port", "0", env={"KMQ_TANSU_BIN": str(tmp_path / "no-such-tansu")}
    )
    assert result.returncode == 1
    assert result.stderr.startswith("kmq: error: KMQ_TANSU_BIN=")
    assert result.stderr.count("\n") == 1


def test_unwritable_data_dir_is_a_one_line_error(tmp_path: Path) -> None:
    # A path below a regular file cannot be created, even by root.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_kmq("broker", "--port", "0", "--data-dir", str(blocker / "data"))
    assert result.returncode == 1
    assert result.stderr.startswith(f"kmq: error: data dir {blocker / 'data'} is not usable")
    assert result.stderr.count("\n") == 1


def test_a_data_dir_serves_one_broker_at_a_time_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    first = BrokerProcess("--port", "0", "--data-dir", str(tmp_path / "d"), log_path=tmp_path / "1")
    children = first.child_pids()
    try:
        second = run_kmq("broker", "--port", "0", "--data-dir", str(tmp_path / "d"))
    finally:
        first.stop_expecting(130, sig=signal.SIGINT)  # Ctrl-C, as README says
    assert second.returncode == 1
    assert "is in use by another kmq broker" in second.stderr
    assert len(children) >= 2  # the broker and its storage
    assert not [pid for pid in children if is_running(pid)]


@pytest.mark.slow
def test_data_dir_keeps_topics_messages_and_offsets_across_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    port = str(free_port())

    # given a durable broker with 20 records, of which a group consumed and committed some
    first = BrokerProcess("--port", port, "--data-dir", data_dir, log_path=tmp_path / "1.log")
    try:
        children = first.child_pids()
        settings = _settings(first.bootstrap_servers)
        provision_topic(settings, "durable", partitions=1)
        producer = Producer(settings.producer_config())
        for i in range(20):
            producer.produce("durable", key=str(i), value=f"v{i}", headers={"n": str(i)})
        assert producer.flush(30) == 0
        del producer  # left alive, it would retry the stopped broker and log each refusal
        consumer = Consumer(settings.consumer_config("keeper"))
        consumer.assign([TopicPartition("durable", 0, 0)])
        consumed = 0
        deadline = time.monotonic() + 30
        while consumed < 8 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            consumed += message is not None and message.error() is None
        consumer.commit(offsets=[TopicPartition("durable", 0, 8)], asynchronous=False)
        consumer.close()
    except BaseException:
        first.kill()
        raise
    # when the broker is stopped with SIGTERM and started again on the same data dir
    first.stop_expecting(0)
    assert not [pid for pid in children if is_running(pid)]
    second = BrokerProcess("--port", port, "--data-dir", data_dir, log_path=tmp_path / "2.log")
    try:
        settings = _settings(second.bootstrap_servers)
        # then the topic, every record and the committed offset are still there
        assert provision_topic(settings, "durable").changed is False
        assert _read_all(settings, "durable", "fresh") == [f"v{i}".encode() for i in range(20)]
        assert _read_all(settings, "durable", "keeper") == [f"v{i}".encode() for i in range(8, 20)]
    finally:
        second.stop_expecting(0)


def test_a_broker_started_the_moment_its_predecessor_was_killed_serves_on_the_same_port(
    tmp_path: Path,
) -> None:
    # given a kmq broker SIGKILLed, and its children gone (the kernel may still be closing
    # Tansu's listening socket: the port reads as taken for a moment)
    run = BrokerRun(Fleet(tmp_path, {}), free_port(), None)
    run.start()
    run.sigkill()

    # when a broker starts on that port at once (a supervisor restarting it)
    broker = EmbeddedBroker(port=run.port)
    try:
        broker.start()
        # then it serves there: not "already in use"
        settings = _settings(broker.bootstrap_servers)
        provision_topic(settings, "again", partitions=1)
    finally:
        broker.stop()


def test_a_durable_broker_on_port_0_takes_a_port_seaweedfs_does_not_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # CI once failed here: the broker's port, picked before SeaweedFS started, was one of
    # SeaweedFS's gRPC ports by the time Tansu bound it. Six ports to pick from: SeaweedFS's
    # five and the broker's must all differ.
    window = narrow_pick_range(monkeypatch, 6)

    with EmbeddedBroker(port=0, data_dir=tmp_path / "data") as broker:
        assert broker.port in window
        assert kafka_answers(broker.host, broker.port)
