"""`--metrics-port`: worker, tracker, delayer and spark serve Prometheus metrics, scraped here."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kmq_dagster.bench import fault_handler
from kmq_dagster.broker.ports import free_port
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, poll_until, wait_for
from tests.processes import kmq_argv

pytestmark = pytest.mark.kafka

REPO_ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def exposition(port: int) -> str:
    """The text served at ``/metrics`` on ``port``; empty if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def scrape(port: int) -> Samples:
    """Every sample served on ``port``, keyed by name and labels; empty if nothing answers."""
    text = exposition(port)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels``; ``None`` if there is none."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    return sum(found) if found else None


class Processes:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> int:
        """Run ``kmq ARGS --metrics-port P``; returns P."""
        port = free_port()
        log = (self.log_dir / f"{args[0]}-{len(self.running)}.log").open("wb")
        process = subprocess.Popen(
            kmq_argv(*args, "--metrics-port", str(port)),
            cwd=REPO_ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.running.append(process)
        return port

    def stop(self) -> None:
        for process in self.running:
            process.send_signal(signal.SIGTERM)
        for process in self.running:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def processes(settings: KmqSettings, tmp_path: Path) -> Iterator[Processes]:
    env = {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": "6000",
        fault_handler.OUTPUT_DIR_ENV: str(tmp_path),
    }
    running = Processes(env, tmp_path)
    yield running
    running.stop()


def test_worker_tracker_and_delayer_serve_their_counts(
    settings: KmqSettings, topic_name: str, group: str, processes: Processes
) -> None:
    queue = new_queue(settings, topic_name, group, partitions=2, delay_queue=True,
                      visibility_timeout_ms=2_000)  # fmt: skip
    producer = KmqProducer(settings)
    # given 5 messages started by a consumer that never acknowledges them
    for i in range(5):
        producer.send(topic_name, f"m-abandoned-{i}".encode())
    producer.flush()
    abandoned = KmqConsumer(queue)
    # all five started (one poll hands out what has arrived: maybe one partition's share)
    assert len(poll_until(abandoned, 5)) == 5
    abandoned.close()
    # and then 20 good messages, 4 poison ones and 3 delayed by a second
    for i in range(20):
        producer.send(topic_name, f"m-{i}".encode())
    for i in range(4):
        producer.send(topic_name, f"poison-{i}".encode())
    for i in range(3):
        producer.send(topic_name, f"m-delayed-{i}".encode(), delay=1)
    producer.flush()

    # when a worker (with its breaker), a tracker and a delayer run with --metrics-port
    args = ["--topic", topic_name, "--group", group]
    worker = processes.start("worker", *args, "--handler", fault_handler.HANDLER_SPEC,
                             "--non-retryable", "PoisonMessageError", "--breaker")  # fmt: skip
    tracker = processes.start("tracker", *args)
    delayer = processes.start("delayer", "--topic", topic_name)

    # then their counts are scraped as the messages flow
    def settled() -> bool:
        counts = scrape(worker)
        return value(counts, "kmq_processed_total") == 20 + 5 + 3 and bool(
            value(counts, "kmq_dead_letters_total")
        )

    assert wait_for(settled, 90), scrape(worker)
    at_worker = scrape(worker)
    labels = {"topic": topic_name, "group": group, "service": "worker"}
    assert value(at_worker, "kmq_dead_letters_total", **labels) == 4
    assert value(at_worker, "kmq_retries_total", **labels) == 0
    assert (value(at_worker, "kmq_acks_total", **labels) or 0) >= 20 + 5 + 3 + 4
    assert value(at_worker, "kmq_handler_failures_total", **labels) == 4
    assert value(at_worker, "kmq_breaker_state", state="closed") == 1
    assert value(at_worker, "kmq_breaker_state", state="open") == 0
    assert value(at_worker, "kmq_in_flight", **labels) is not None

    at_tracker = scrape(tracker)
    assert value(at_tracker, "kmq_redeliveries_total", service="tracker") == 5
    assert wait_for(lambda: value(scrape(tracker), "kmq_in_flight") == 0, 30)
    assert value(scrape(tracker), "kmq_oldest_unacked_age_seconds") == 0

    at_delayer = scrape(delayer)
    assert value(at_delayer, "kmq_delayed_delivered_total", service="delayer") == 3
    for port in (worker, tracker, delayer):
        assert "# TYPE kmq_client_errors_total counter" in exposition(port)


def test_a_tracker_reports_how_long_its_oldest_message_waits(
    settings: KmqSettings, topic_name: str, group: str, processes: Processes
) -> None:
    queue = new_queue(settings, topic_name, group, partitions=1, visibility_timeout_ms=60_000)
    producer = KmqProducer(settings)
    producer.send(topic_name, b"never acknowledged")
    producer.flush()
    tracker = processes.start("tracker", "--topic", topic_name, "--group", group)
    taker = KmqConsumer(queue)
    assert wait_for(lambda: len(taker.poll(timeout_s=0.5)) > 0, 30)
    taker.flush()
    # the tracker sees it in flight, and its age grows (its process starts, joins its group
    # and reads the markers first: a minute and more on a loaded machine)
    assert wait_for(lambda: value(scrape(tracker), "kmq_in_flight") == 1, 120)
    age = "kmq_oldest_unacked_age_seconds"
    assert wait_for(lambda: (value(scrape(tracker), age) or 0) >= 2, 30)
    taker.close()


@pytest.mark.spark
@pytest.mark.slow
def test_spark_serves_its_batch_counts(
    settings: KmqSettings, topic_name: str, group: str, processes: Processes, tmp_path: Path
) -> None:
    new_queue(settings, topic_name, group, partitions=2)
    producer = KmqProducer(settings)
    for i in range(50):
        producer.send(topic_name, f"m-{i}".encode())
    producer.flush()
    port = processes.start(
        "spark", "--topic", topic_name, "--group", group,
        "--function", "tests.support.spark_functions:slow_echo",
        "--output", str(tmp_path / "out.parquet"), "--forever",
    )  # fmt: skip
    assert wait_for(lambda: value(scrape(port), "kmq_processed_total") == 50, 180)
    assert value(scrape(port), "kmq_handler_failures_total", service="spark") == 0
