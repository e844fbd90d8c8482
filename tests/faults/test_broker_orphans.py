"""`kmq broker` killed with SIGKILL takes its children along: nothing keeps the port."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kmq_dagster.broker.ports import free_port
from kmq_dagster.child_processes import is_running
from kmq_dagster.kafka.provision import provision_topic
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import wait_for
from tests.processes import BrokerProcess

pytestmark = pytest.mark.kafka


def test_a_sigkilled_durable_broker_leaves_no_orphans_and_restarts_on_its_port(
    tmp_path: Path,
) -> None:
    port = str(free_port())
    data_dir = str(tmp_path / "data")
    # given a durable broker: kmq broker, Tansu and SeaweedFS
    first = BrokerProcess("--port", port, "--data-dir", data_dir, log_path=tmp_path / "1.log")
    children = first.child_pids()
    try:
        settings = KmqSettings(bootstrap_servers=first.bootstrap_servers)
        provision_topic(settings, "kept", partitions=2, delay_queue=False)
        assert len(children) >= 2, "the broker and its storage run as children"
        # when only the kmq broker process is SIGKILLed
        first.popen.send_signal(signal.SIGKILL)
        first.popen.wait(timeout=30)
        # then its children die with it
        assert wait_for(lambda: not [pid for pid in children if is_running(pid)], timeout_s=10)
    finally:
        first.kill()
    # and a new broker starts on the same port and data dir, with the topic still there
    second = BrokerProcess("--port", port, "--data-dir", data_dir, log_path=tmp_path / "2.log")
    try:
        settings = KmqSettings(bootstrap_servers=second.bootstrap_servers)
        assert provision_topic(settings, "kept", delay_queue=False).changed is False
    finally:
        second.stop_expecting(0)
