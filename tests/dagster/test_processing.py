"""Sensor-launched processing on the real broker and local Spark: backlog -> tick -> run ->
output rows -> checks pass; an open breaker stops a run; two runs never share partitions."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, ExecuteInProcessResult
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession

from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.demo_orders import is_flaky, is_poison
from tests.dagster.helpers import QueueUnderTest, declare, produce_orders

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
    result = launch(q, request)

    assert result.success
    figures = materialization(result)
    assert figures["succeeded"] == figures["distinct_rows"] == figures["rows_written"] == len(good)
    assert figures["read"] == len(ids) + sum(map(is_flaky, ids))
    assert figures["retried"] == sum(map(is_flaky, ids))
    assert figures["dead_lettered"] == sum(map(is_poison, ids))
    assert figures["stopped"] == "idle"
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
        topic_name, "pricing", state="open", opened_at_ms=0, cooldown_ms=10_000,
        expected_version=None,
    )  # fmt: skip

    figures = materialization(launch(q))

    assert figures["stopped"] == "breaker open"
    assert figures["batches"] == figures["read"] == 0


@pytest.mark.slow
def test_two_runs_of_one_queue_never_own_the_same_partitions_at_once(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource, pyspark: PySparkResource,
) -> None:  # fmt: skip
    q = declare(topic_name, tmp_path, instance, kmq, audit, pyspark)
    produce_orders(kmq, topic_name, range(4_000))
    results: list[ExecuteInProcessResult] = []

    def run() -> None:
        results.append(launch(q, max_messages_per_partition=200))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)

    assert len(results) == 2 and all(r.success for r in results)
    first, second = (materialization(r) for r in results)
    assert first["read"] > 0 and second["read"] > 0, "both runs took part"
    overlapping = [
        (a, b)
        for a in first["batch_leases"]
        for b in second["batch_leases"]
        if a[0] < b[1] and b[0] < a[1] and set(a[2]) & set(b[2])
    ]
    assert overlapping == [], "two runs owned one partition at the same time"
    assert first["succeeded"] + second["succeeded"] >= sum(not is_poison(i) for i in range(4_000))
