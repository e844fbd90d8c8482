"""The keep-alive sensor keeps exactly one tracker run: it launches one when none runs, never
a second, and replaces a run whose process died (its heartbeat went quiet)."""

from __future__ import annotations

import time

from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec
from kmq_dagster.defs.tracker import HEARTBEAT_TAG, make_tracker_keepalive_sensor, tracker_job

SPEC = QueueSpec(Queue("orders", "pricing", partitions=2))
JOB = tracker_job(SPEC)
SENSOR = make_tracker_keepalive_sensor(SPEC, JOB)


def tick(instance: DagsterInstance):  # type: ignore[no-untyped-def]
    return SENSOR(build_sensor_context(instance=instance))


def test_no_tracker_running_launches_one_and_concurrent_ticks_launch_it_once(
    instance: DagsterInstance,
) -> None:
    first, second = tick(instance), tick(instance)
    assert [r.run_key for r in first.run_requests] == ["tracker-after-none"]
    assert [r.run_key for r in second.run_requests] == ["tracker-after-none"]  # deduplicated


def test_a_live_tracker_run_is_left_alone(instance: DagsterInstance) -> None:
    run = create_run_for_test(
        instance, job_name=JOB.name, status=DagsterRunStatus.STARTED,
        tags={HEARTBEAT_TAG: f"{time.time():.3f}"},
    )  # fmt: skip
    result = tick(instance)
    assert result.run_requests == []
    assert result.skip_reason.skip_message == f"tracker run {run.run_id} is started"


def test_a_tracker_run_whose_heartbeat_stopped_is_failed_and_replaced(
    instance: DagsterInstance,
) -> None:
    dead = create_run_for_test(
        instance, job_name=JOB.name, status=DagsterRunStatus.STARTED,
        tags={HEARTBEAT_TAG: f"{time.time() - 60:.3f}"},
    )  # fmt: skip
    result = tick(instance)
    assert [r.run_key for r in result.run_requests] == [f"tracker-after-{dead.run_id}"]
    replaced = instance.get_run_by_id(dead.run_id)
    assert replaced is not None and replaced.status == DagsterRunStatus.FAILURE
