"""A topic of the queue deleted under a running tracker and worker stops each of them with one
error line that names it and the fix, at any concurrency: never a segfault (librdkafka 2.16
crashes on the embedded broker's answer for a topic deleted while fetched: the crash guard
explains it), never silence (a deleted subscribed topic can drop out of the assignment without
any fetch error: the topic watch sees it).

Real ``kmq tracker`` and ``kmq worker`` processes on the embedded broker. (The markers topic's
case, and that no message is lost through it, is in ``test_cli_fuzz``.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kmq_dagster.kafka.clients import admin_client
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce, wait_for
from tests.processes import kmq_argv, stop

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.mark.parametrize(
    ("victim", "concurrency"),
    [("retry.10s", "4"), ("redelivery", "1"), ("dlq", "4"), ("", "2")],
    ids=["retry.10s/4", "redelivery/1", "dlq/4", "queue topic/2"],
)
def test_a_topic_deleted_under_tracker_and_worker_stops_each_with_one_line(
    settings: KmqSettings, topic_name: str, tmp_path: Path, victim: str, concurrency: str
) -> None:
    group = f"gone-{topic_name[-8:]}"
    new_queue(settings, topic_name, group, partitions=2)
    deleted = f"{topic_name}.{group}.{victim}" if victim else topic_name
    called = tmp_path / "called.txt"
    (tmp_path / "failing.py").write_text(
        "def handle(m):\n"
        f"    with open({str(called)!r}, 'a') as f:\n"
        "        f.write(m.value.decode() + '\\n')\n"
        "    raise ValueError('the payment service is down')\n"
    )
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000"}  # fmt: skip
    queue_args = ["-t", topic_name, "-g", group]
    logs: dict[str, Path] = {}

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("w") as out:
            return subprocess.Popen(kmq_argv(*args), env=env, cwd=tmp_path, stdout=out,
                                    stderr=out)  # fmt: skip

    tracker = start("tracker", "tracker", *queue_args)
    worker = start("worker", "worker", *queue_args, "--handler", "failing:handle",
                   "--concurrency", concurrency)  # fmt: skip
    processes = {"tracker": tracker, "worker": worker}
    try:
        # given both at work: the handler fails, copies go to the first retry topic
        produce(settings, topic_name, [f"order-{i}".encode() for i in range(20)], partitions=2)
        assert wait_for(lambda: called.exists() and len(called.read_text().split()) >= 20, 120)
        assert wait_for(lambda: logs["tracker"].read_text().count("caught up") >= 2, 120)

        # when one topic of the queue is deleted, and work keeps coming
        admin = admin_client(settings)  # kept: a collected client cancels its request
        admin.delete_topics([deleted])[deleted].result(30)
        if victim:  # (a send to a deleted queue topic may create it again, on any broker
            # that auto-creates topics: the watch must see the deletion without that help)
            produce(settings, topic_name, [b"after"], partitions=2)
        codes = {name: process.wait(120) for name, process in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop(process)

    # then each stops with exit code 1 and one error line naming the topic and the fix
    for name, code in codes.items():
        output = logs[name].read_text()
        errors = [line for line in output.splitlines() if line.startswith("kmq: error: ")]
        assert code == 1, (name, code, output[-2000:])
        assert len(errors) == 1, (name, output[-2000:])
        assert deleted in errors[0] and "kmq provision" in errors[0], (name, errors[0])
