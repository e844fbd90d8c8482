"""`kmq spark` honours the group's shared circuit breaker: no batch starts while it is open
(before the driver joins the group, and between batches), and processing goes on once it
closes. The breaker is set in the audit store as the group's workers or the Dagster breaker
sensor set it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import TopicPartition

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.kafka.clients import new_consumer
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import LONGEST_WAIT_S, WaitBudget, new_queue, produce, wait_for
from tests.processes import kmq_argv

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
WAITING = "is open: no batch starts; waiting"


def rows_in(output: Path) -> int:
    return pq.read_table(output).num_rows if output.exists() else 0


def committed_total(settings: KmqSettings, topic: str, group: str) -> int:
    """The group's committed offsets on the queue topic, added up (0 where none)."""
    consumer = new_consumer(settings, group)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in found)


def set_breaker(store: AuditStore, topic: str, group: str, state: str) -> None:
    row = store.breaker_state(topic, group)
    assert store.save_breaker_state(
        topic, group, state=state, opened_at_ms=int(time.time() * 1000), cooldown_ms=600_000,
        expected_version=None if row is None else row.version,
    )  # fmt: skip


def test_kmq_spark_starts_no_batch_while_the_breaker_is_open_and_goes_on_once_it_closes(
    settings: KmqSettings, topic_name: str, tmp_path: Path, private_audit_store: str
) -> None:
    # given: a queue whose group's breaker is open, and 100 messages on it
    group = f"spark-{topic_name}"
    new_queue(settings, topic_name, group, partitions=2, retry_delays_ms=(1_000,))
    store = AuditStore(private_audit_store)
    set_breaker(store, topic_name, group, "open")
    produce(settings, topic_name, [str(i).encode() for i in range(100)], partitions=2)
    output, log = tmp_path / "out", tmp_path / "spark.log"
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000"}  # fmt: skip
    budget = WaitBudget(LONGEST_WAIT_S)
    spark = subprocess.Popen(
        kmq_argv("spark", "--topic", topic_name, "--group", group, "--output", str(output),
                 "--function", "tests.support.spark_functions:slow_echo", "--forever"),
        cwd=REPO_ROOT, env=env, start_new_session=True, stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # when kmq spark starts, it waits for the breaker before it joins the group
        assert wait_for(lambda: WAITING in log.read_text(), timeout_s=budget.left_s()), (
            log.read_text()[-3000:]
        )
        # then nothing was read or committed
        assert (rows_in(output), committed_total(settings, topic_name, group)) == (0, 0)

        # when the breaker closes, the backlog is processed
        set_breaker(store, topic_name, group, "closed")
        assert wait_for(lambda: rows_in(output) == 100, timeout_s=budget.left_s()), log.read_text()[
            -3000:
        ]

        # when it opens again between batches, the next messages wait
        set_breaker(store, topic_name, group, "open")
        assert wait_for(lambda: log.read_text().count(WAITING) == 2, timeout_s=budget.left_s()), (
            log.read_text()[-3000:]
        )
        produce(settings, topic_name, [str(i).encode() for i in range(100, 150)], partitions=2)
        committed = committed_total(settings, topic_name, group)
        assert (rows_in(output), committed) == (100, 100)

        # and go once it closes
        set_breaker(store, topic_name, group, "closed")
        assert wait_for(lambda: rows_in(output) == 150, timeout_s=budget.left_s()), log.read_text()[
            -3000:
        ]
        spark.send_signal(signal.SIGTERM)  # the driver; it stops its own JVM
        assert spark.wait(timeout=budget.left_s()) == 0, log.read_text()[-3000:]
    finally:
        if spark.poll() is None:
            os.killpg(spark.pid, signal.SIGKILL)
            spark.wait(timeout=30)
