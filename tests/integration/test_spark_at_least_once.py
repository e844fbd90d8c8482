"""At-least-once through Spark: the `kmq spark` driver is SIGKILLed mid-batch (with its JVM and
Python workers); the tracker redelivers; after a rerun, the output holds every message exactly
once after deduplication by coordinates, none missing."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.session import local_session
from tests.kafka_helpers import (
    LONGEST_WAIT_S,
    WaitBudget,
    new_queue,
    produce,
    running_service,
    wait_for,
)
from tests.processes import kmq_argv

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

MESSAGES = 3_000
REPO_ROOT = Path(__file__).resolve().parents[2]


def group_of(topic: str) -> str:
    """A group per test: members of one group on other topics (other tests, other xdist
    workers) would rebalance with this test's members, and a SIGKILLed one holds them up."""
    return f"spark-{topic}"


def queue_holding(settings: KmqSettings, topic: str, messages: int) -> OpenedQueue:
    """The Spark group's queue on ``topic`` (2 partitions, a 5 s visibility timeout, one retry
    after 1 s), holding the messages ``0`` to ``messages - 1``."""
    queue = new_queue(settings, topic, group_of(topic), partitions=2, retry_delays_ms=(1_000,),
                      visibility_timeout_ms=5_000)  # fmt: skip
    produce(settings, topic, [str(i).encode() for i in range(messages)], partitions=2)
    return queue


def driver_environment(settings: KmqSettings) -> dict[str, str]:
    """The environment of a ``kmq spark`` driver on the session's broker."""
    return {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": "6000",
    }


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("kmq-tests-reader")
    yield session
    session.stop()


def test_a_driver_killed_mid_batch_loses_nothing(
    spark: SparkSession, settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    group = group_of(topic_name)
    queue = queue_holding(settings, topic_name, MESSAGES)
    output = tmp_path / "out"
    argv = kmq_argv(
        "spark", "--topic", topic_name, "--group", group, "--output", str(output),
        "--function", "tests.support.spark_functions:slow_echo", "--max-per-partition", "300",
    )  # fmt: skip
    env = driver_environment(settings)
    hanging = tmp_path / "hanging"
    # the first batch (offsets 0-299 per partition) completes; the second hangs in its tasks
    first_env = {**env, "KMQ_TEST_HANG_FROM_OFFSET": "300", "KMQ_TEST_HANGING_FLAG": str(hanging)}

    budget = WaitBudget(LONGEST_WAIT_S)
    first = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=first_env, start_new_session=True,
        stdout=(tmp_path / "first.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert wait_for(hanging.exists, timeout_s=budget.left_s()), "the second batch never started"
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    before = spark.read.parquet(str(output)).count()
    assert before < MESSAGES, "the kill must land mid-way"

    # past the visibility timeout, the tracker redelivers what the killed batch had started
    with running_service(RedeliveryTracker(queue)) as tracker:
        assert wait_for(lambda: tracker.stats.redelivered > 0, timeout_s=budget.left_s())
    second = subprocess.run(
        argv,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget.left_s(),
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]

    rows = spark.read.parquet(str(output)).select("topic", "partition", "offset", "result")
    by_coordinates = {(r[0], r[1], r[2]): json.loads(r[3]) for r in rows.collect()}
    results = collections.Counter(by_coordinates.values())
    missing = {str(i) for i in range(MESSAGES)} - set(results)
    print(
        f"rows before the kill {before}, rows in all {rows.count()}, after deduplication "
        f"{len(by_coordinates)}; tracker redelivered {tracker.stats.redelivered}"
    )
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert len(by_coordinates) == MESSAGES
    assert all(count == 1 for count in results.values())


def test_a_driver_killed_after_its_output_write_acknowledged_nothing_and_all_come_back(
    spark: SparkSession, settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    # given 600 messages; a driver whose first batch (up to 200 per partition) writes its output
    # and is then SIGKILLed with its JVM and workers, before any acknowledgement (invariant 3)
    group = group_of(topic_name)
    messages = 600
    queue = queue_holding(settings, topic_name, messages)
    output = tmp_path / "out"
    env = driver_environment(settings)
    budget = WaitBudget(LONGEST_WAIT_S)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.support.spark_killed_after_write", topic_name, group,
         str(output)],
        cwd=REPO_ROOT, env=env, start_new_session=True, capture_output=True, text=True,
        timeout=budget.left_s(), check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert "output committed" in killed.stdout
    # A batch reads what a third of the visibility timeout allows, at most 200 per partition:
    # on a loaded machine that can be fewer, so count what the killed batch committed.
    written = spark.read.parquet(str(output)).count()
    assert 0 < written <= 400, f"the killed batch committed {written} rows"

    # then its messages were never acknowledged: the tracker redelivers every one of them
    with running_service(RedeliveryTracker(queue)) as tracker:
        assert wait_for(lambda: tracker.stats.redelivered >= written, timeout_s=budget.left_s()), (
            f"only {tracker.stats.redelivered} of {written} written messages came back"
        )
    # and a rerun processes the rest and the redelivered copies: nothing missing
    rerun = subprocess.run(
        kmq_argv("spark", "--topic", topic_name, "--group", group, "--output", str(output),
                 "--function", "tests.support.spark_functions:slow_echo"),
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=budget.left_s(),
        check=False,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    rows = spark.read.parquet(str(output)).select("result").collect()
    missing = {str(i) for i in range(messages)} - {json.loads(r[0]) for r in rows}
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
