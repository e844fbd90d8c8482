"""Sensor-launched processing on the real broker and local Spark: backlog -> tick -> run ->
output rows -> checks pass; an open breaker stops a run; two runs never share partitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, ExecuteInProcessResult
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession

from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.demo.orders import is_flaky, is_poison
from kmq_dagster.operations.queue_status import measure_queue
from kmq_dagster.settings import KmqSettings
from tests.dagster.helpers import QueueUnderTest, declare, group_for, produce_orders
from tests.kafka_helpers import new_queue, wait_for
from tests.support.spark_functions import slow_price

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def launch(q: QueueUnderTest, request: Any = None, **run_config: Any) -> ExecuteInProcessResult:
    """Execute the processing job as the daemon would for ``request``."""
    tags = {} if request is None else {**request.tags, "dagster/run_key": request.run_key}
    job = q.defs.resolve_job_def(q.spec.job_name("process"))
    config = {"ops": {q.spec.output_asset_key.to_python_identifier(): {"config": run_config}}}
    return job.execute_in_process(
        instance=q.instance, tags=tags, run_config=config if run_config else None
    )


def materialization(result: ExecuteInProcessResult) -> dict[str, Any]:
    (event,) = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_a_backlog_tick_launches_a_run_whose_output_passes_its_check(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource, pyspark: PySparkResource,
) -> None:  # fmt: skip
    q = declare(topic_name, tmp_path, instance, kmq, audit, pyspark)
    ids = range(40)
    produce_orders(kmq, topic_name, ids)
    good = [i for i in ids if not is_poison(i)]

    request = q.tick("backlog").run_requests[0]
    results = [launch(q, request)]
    # The flaky orders' retries come due 1 s after they failed. A run ends when it finds
    # nothing to read; if it ended before they were due, the next backlog tick asks for a run.
    if sum(measure_queue(kmq.open_queue(q.spec.queue)).retry_depths.values()):
        assert wait_for(lambda: q.tick("backlog").run_requests, timeout_s=30, interval_s=0.5)
        results.append(launch(q, q.tick("backlog").run_requests[0]))

    assert all(result.success for result in results)
    runs = [materialization(result) for result in results]
    total = {key: sum(run[key] for run in runs) for key in runs[0] if isinstance(runs[0][key], int)}
    assert total["succeeded"] == total["distinct_rows"] == total["rows_written"] == len(good)
    assert total["read"] == len(ids) + sum(map(is_flaky, ids))
    assert total["retried"] == sum(map(is_flaky, ids))
    assert total["dead_lettered"] == sum(map(is_poison, ids))
    assert [run["stopped"] for run in runs] == ["idle"] * len(runs)
    for result in results:
        (check,) = result.get_asset_check_evaluations()
        assert check.check_name == "output_matches_acks"
        assert check.passed
    spark = SparkSession.getActiveSession()
    assert spark is not None
    frame = spark.read.parquet(q.spec.output_path or "")
    assert sorted(int(r["key"]) for r in frame.select("key").collect()) == good
    # the backlog is gone: the next tick does not ask again
    assert q.tick("backlog").skip_reason.skip_message.startswith(f"no backlog for {topic_name}")


def test_a_run_started_while_the_breaker_is_open_processes_nothing(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource, pyspark: PySparkResource,
) -> None:  # fmt: skip
    q = declare(topic_name, tmp_path, instance, kmq, audit, pyspark)
    produce_orders(kmq, topic_name, range(10))
    audit.get_store().save_breaker_state(
        topic_name, q.spec.queue.group, state="open", opened_at_ms=0, cooldown_ms=10_000,
        expected_version=None,
    )  # fmt: skip

    figures = materialization(launch(q))

    assert figures["stopped"] == "breaker open"
    assert figures["batches"] == figures["read"] == 0


#: pytest's limit for the two-runs test follows its waits: up to 240 s for the other run's
#: first batch (a Spark session of its own first), this run, then up to 300 s for the other to
#: end. Beside two busy loops and two other Dagster tests it outlasted the default 300 s.
TWO_RUNS_TIMEOUT_S = 240 + 300 + 180


@pytest.mark.slow
@pytest.mark.timeout(TWO_RUNS_TIMEOUT_S)
def test_two_runs_of_one_queue_never_own_the_same_partitions_at_once(
    settings: KmqSettings, topic_name: str, tmp_path: Path, instance: DagsterInstance,
    kmq: KmqResource, audit: AuditStoreResource, pyspark: PySparkResource,
    private_audit_store: str,
) -> None:  # fmt: skip
    # given: a backlog that takes a run a while (10 ms per message, small batches)
    q = declare(topic_name, tmp_path, instance, kmq, audit, pyspark, function=slow_price)
    produce_orders(kmq, topic_name, range(4_000))
    # when: a second run starts in a process of its own while this one runs (writing beside
    # this one's output: two Spark jobs appending to one Parquet path at once collide in
    # Hadoop's output committer, which the lease does not cover)
    other = subprocess.Popen(
        [sys.executable, "-m", "tests.dagster.processing_process", topic_name,
         str(tmp_path / "other.parquet"), "100"],
        env={**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
             "KMQ_SESSION_TIMEOUT_MS": "6000", "KMQ_AUDIT_URL": private_audit_store},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # once the other run has acknowledged its first batch (it starts a Spark session of
        # its own first; on a loaded machine that alone can outlast the backlog)
        assert wait_for(
            lambda: (
                other.poll() is not None or measure_queue(kmq.open_queue(q.spec.queue)).consumed > 0
            ),
            timeout_s=240,
        ), "the other run never processed a batch"
        here = materialization(launch(q, max_messages_per_partition=150))
        out, _ = other.communicate(timeout=300)
    finally:
        other.kill()
        other.wait()
    there = json.loads(out.strip().splitlines()[-1])

    # then: both took part, and no partition was owned by both while their batches overlapped
    assert here["read"] > 0 and there["read"] > 0, "both runs processed messages"
    concurrent = [
        (a, b)
        for a in here["batch_leases"]
        for b in there["batch_leases"]
        if a[0] < b[1] and b[0] < a[1]
    ]
    assert concurrent, f"the runs' batches never overlapped: nothing was tested: {here} {there}"
    shared = [(a, b) for a, b in concurrent if set(a[2]) & set(b[2])]
    assert shared == [], "two runs owned one partition at the same time"


def test_a_run_from_a_virtualenv_not_activated_runs_spark_workers_on_its_interpreter(
    settings: KmqSettings, topic_name: str, tmp_path: Path, kmq: KmqResource,
    private_audit_store: str,
) -> None:  # fmt: skip
    # given: a run started as `.venv/bin/python ...` without activating the venv: its bin
    # directory is not on PATH, and `python3` on PATH is another interpreter (here one that
    # fails at once), with no PYSPARK_PYTHON set
    other_python = tmp_path / "other-bin"
    other_python.mkdir()
    for name in ("python3", "python"):
        script = other_python / name
        script.write_text("#!/bin/sh\necho 'not the interpreter kmq runs in' >&2\nexit 3\n")
        script.chmod(0o755)
    venv_bin = str(Path(sys.executable).parent)
    path = [str(other_python), *(d for d in os.environ["PATH"].split(os.pathsep) if d != venv_bin)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}  # fmt: skip
    env.update(PATH=os.pathsep.join(path), KMQ_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
               KMQ_SESSION_TIMEOUT_MS="6000", KMQ_AUDIT_URL=private_audit_store)  # fmt: skip
    new_queue(settings, topic_name, group_for(topic_name), partitions=2, retry_delays_ms=(1_000,))
    produce_orders(kmq, topic_name, range(20))
    # when: the Dagster processing job runs in that process
    run = subprocess.run(
        [sys.executable, "-m", "tests.dagster.processing_process", topic_name,
         str(tmp_path / "out.parquet"), "100"],
        env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    # then: its Spark tasks ran (on the run's own interpreter) and read every order
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["read"] >= 20, figures
