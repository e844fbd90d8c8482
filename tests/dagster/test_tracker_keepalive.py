"""The keep-alive sensor keeps exactly one tracker run: it waits, saying why, until the queue is
provisioned, then launches one when none runs, never a second, and replaces a run whose process
died (its heartbeat went quiet). Against the session's real broker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.defs.tracker import HEARTBEAT_TAG, make_tracker_keepalive_sensor, tracker_job
from kmq_dagster.kafka.provision import provision_queue

pytestmark = pytest.mark.kafka


class KeepAlive:
    """The keep-alive sensor of a queue of the test's own, ticked as the daemon ticks it."""

    def __init__(self, topic: str, kmq: KmqResource, instance: DagsterInstance) -> None:
        self.spec = QueueSpec(Queue(topic, "pricing", partitions=2))
        self.job = tracker_job(self.spec)
        self.sensor = make_tracker_keepalive_sensor(self.spec, self.job)
        self.kmq, self.instance = kmq, instance

    def provision(self) -> KeepAlive:
        provision_queue(self.kmq.get_settings(), self.spec.queue)
        return self

    def tick(self) -> Any:
        with build_sensor_context(instance=self.instance, resources={"kmq": self.kmq}) as context:
            return self.sensor(context)


@pytest.fixture
def keepalive(topic_name: str, kmq: KmqResource, instance: DagsterInstance) -> KeepAlive:
    return KeepAlive(topic_name, kmq, instance)


def test_an_unprovisioned_queue_gets_no_tracker_run_until_it_is_provisioned(
    keepalive: KeepAlive,
) -> None:
    waiting = keepalive.tick()

    assert waiting.run_requests == []
    said = waiting.skip_reason.skip_message
    assert said.startswith(f"{keepalive.spec.queue} is not provisioned yet, so no tracker run")
    assert f"launch provision_{keepalive.spec.name}" in said, said

    keepalive.provision()
    assert [r.run_key for r in keepalive.tick().run_requests] == ["tracker-after-none"]


def test_no_tracker_running_launches_one_and_concurrent_ticks_launch_it_once(
    keepalive: KeepAlive,
) -> None:
    first, second = keepalive.provision().tick(), keepalive.tick()
    assert [r.run_key for r in first.run_requests] == ["tracker-after-none"]
    assert [r.run_key for r in second.run_requests] == ["tracker-after-none"]  # deduplicated


def test_a_live_tracker_run_is_left_alone(keepalive: KeepAlive, instance: DagsterInstance) -> None:
    run = create_run_for_test(
        instance, job_name=keepalive.job.name, status=DagsterRunStatus.STARTED,
        tags={HEARTBEAT_TAG: f"{time.time():.3f}"},
    )  # fmt: skip
    result = keepalive.provision().tick()
    assert result.run_requests == []
    assert result.skip_reason.skip_message == f"tracker run {run.run_id} is started"


def test_a_tracker_run_whose_heartbeat_stopped_is_failed_and_replaced(
    keepalive: KeepAlive, instance: DagsterInstance
) -> None:
    dead = create_run_for_test(
        instance, job_name=keepalive.job.name, status=DagsterRunStatus.STARTED,
        tags={HEARTBEAT_TAG: f"{time.time() - 60:.3f}"},
    )  # fmt: skip
    result = keepalive.provision().tick()
    assert [r.run_key for r in result.run_requests] == [f"tracker-after-{dead.run_id}"]
    replaced = instance.get_run_by_id(dead.run_id)
    assert replaced is not None and replaced.status == DagsterRunStatus.FAILURE
