"""`kmq spark` on a real Spark standalone cluster: a master and two workers started from the
installed pyspark, executors in their own JVMs with their own Python workers. Same results and
guarantees as in local mode: successes written, bad input dead-lettered, everything
acknowledged, offsets committed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from kmq_dagster.broker.ports import free_port
from kmq_dagster.core.naming import dlq_topic, redelivery_topic
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce, read_topic, running_service, wait_for
from tests.processes import kmq_argv

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

MESSAGES = 400
REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_CLASS = Path(sys.executable).parent / "spark-class"


class StandaloneCluster:
    """A master and ``workers`` one-core workers on loopback, stopped by PID."""

    def __init__(self, scratch: Path, workers: int = 2) -> None:
        self.scratch = scratch
        self.port, self.ui_port, *self.worker_ports = distinct_free_ports(2 + 2 * workers)
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.work_dirs = [scratch / f"worker-{i}" for i in range(workers)]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.last_answer = "nothing yet"
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
                    # Spark 4.1+ masters also serve unauthenticated REST submissions on the
                    # fixed port 6066; kmq submits through the master's RPC port only.
                    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}  # fmt: skip

    def start(self) -> None:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))  # fmt: skip
        for index, work_dir in enumerate(self.work_dirs):
            port, ui_port = self.worker_ports[2 * index : 2 * index + 2]
            self._spawn(
                f"worker-{index}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(port), "--webui-port", str(ui_port), "--cores", "1",
                "--memory", "1g", "--work-dir", str(work_dir), self.master_url,
            )  # fmt: skip
        assert wait_for(lambda: self._alive_workers() == len(self.work_dirs), timeout_s=120), (
            f"the workers never registered with the master; port {self.ui_port} last answered "
            f"{self.last_answer}"
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = (self.scratch / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [str(SPARK_CLASS), main_class, *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def _alive_workers(self) -> int:
        """Workers the master counts alive; 0 while its web UI is not up or not whole yet.

        The port is the one the master's log says its UI took: Spark moves up a port when the
        one asked for is taken. Once in CI, with the machine loaded, ``/json`` answered with a
        Spark HTML page while the cluster started, so anything but JSON counts as "not ready",
        and what answered is kept for the failure message.
        """
        log = (self.scratch / "master.log").read_text(errors="replace")
        started = re.search(r"Successfully started service 'MasterUI' on port (\d+)", log)
        if started is None:
            self.last_answer = "nothing: the master's log names no UI port yet"
            return 0
        self.ui_port = int(started.group(1))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=2) as r:
                body = r.read()
        except OSError as error:
            self.last_answer = f"an error: {error}"
            return 0
        try:
            return int(json.loads(body).get("aliveworkers", 0))
        except ValueError:
            self.last_answer = f"not JSON: {body[:120]!r}"
            return 0


def distinct_free_ports(count: int) -> list[int]:
    """``count`` free ports, no two the same."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    running = StandaloneCluster(tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()
    assert all(process.poll() is not None for process in running.processes)


def test_kmq_spark_on_a_standalone_cluster_gives_the_same_results_and_guarantees(
    cluster: StandaloneCluster, settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    queue = new_queue(settings, topic_name, partitions=2, retry_delays_ms=(1_000,),
              visibility_timeout_ms=6_000)  # fmt: skip
    produce(settings, topic_name, [str(i).encode() for i in range(MESSAGES)], partitions=2)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    # What a user puts in spark-defaults.conf for a cluster; here all on one machine.
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.driver.host 127.0.0.1\n"
        "spark.cores.max 2\n"
        "spark.executor.cores 1\n"
        "spark.executor.memory 512m\n"
        "spark.scheduler.minRegisteredResourcesRatio 1.0\n"
        f"spark.pyspark.python {sys.executable}\n"
        f"spark.executorEnv.PYTHONPATH {REPO_ROOT}\n"
    )
    output = tmp_path / "out"
    result = subprocess.run(
        kmq_argv(
            "spark",
            "--master",
            cluster.master_url,
            "--topic",
            topic_name,
            "--group",
            queue.group,
            "--function",
            "tests.support.spark_functions:where_it_ran",
            "--output",
            str(output),
            "--non-retryable",
            "ValueError",
        ),
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "KMQ_SESSION_TIMEOUT_MS": "6000",
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"read {MESSAGES}, succeeded 360, failed 40" in result.stdout

    rows = ds.dataset(str(output), format="parquet").to_table().to_pylist()
    results = [json.loads(row["result"]) for row in rows]
    assert sorted(r["n"] for r in results) == [i for i in range(MESSAGES) if i % 10]
    assert len({(row["partition"], row["offset"]) for row in rows}) == 360
    # run by executors in the workers' own directories, in processes other than the driver's
    ran_in = {Path(r["cwd"]).relative_to(tmp_path).parts[0] for r in results}
    assert ran_in == {"worker-0", "worker-1"}
    assert len({r["pid"] for r in results}) >= 2
    dead = read_topic(settings, dlq_topic(topic_name, queue.group), 2, at_least=40)
    assert sorted(int(r.value() or b"-1") for r in dead) == list(range(0, MESSAGES, 10))
    # everything was acknowledged: past the visibility timeout, nothing comes back
    with running_service(RedeliveryTracker(queue)) as tracker:
        time.sleep(8)
    assert tracker.stats.redelivered == 0
    assert read_topic(settings, redelivery_topic(topic_name, queue.group), 2, timeout_s=3) == []
