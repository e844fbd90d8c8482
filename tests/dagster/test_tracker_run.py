"""A tracker run that is terminated stops even when Dagster's interrupt never reaches its op:
the op sees its run's status at its next heartbeat, and the run ends CANCELED, not stuck in
CANCELING (a loaded CI run once waited over 60 s there). Against the session's real broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from dagster import DagsterInstance, DagsterRunStatus, ExecuteInProcessResult, instance_for_test

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.defs.tracker import HEARTBEAT_TAG, tracker_job
from kmq_dagster.kafka.provision import provision_queue
from tests.kafka_helpers import wait_for

pytestmark = pytest.mark.kafka

#: No compute-log capture: in process it runs ``tail`` processes whose clean-up kept a loaded CI
#: run's thread past the test's limit after the run had stopped (Dagster's capture, not the
#: tracker, which said it stopped in 0.8 s).
UNCAPTURED = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}


@pytest.fixture
def uncaptured_instance() -> Iterator[DagsterInstance]:
    with instance_for_test(overrides=UNCAPTURED) as test_instance:
        yield test_instance


def test_a_terminated_tracker_run_whose_op_got_no_interrupt_still_ends_canceled(
    topic_name: str, kmq: KmqResource, uncaptured_instance: DagsterInstance
) -> None:
    instance = uncaptured_instance
    spec = QueueSpec(Queue(topic_name, "pricing", partitions=2))
    provision_queue(kmq.get_settings(), spec.queue)
    job = tracker_job(spec)
    results: list[ExecuteInProcessResult] = []

    # Off the main thread Dagster installs no SIGINT handler: no interrupt can reach the op,
    # as when the one SIGINT of a termination is lost on its way.
    def run() -> None:
        results.append(
            job.execute_in_process(instance=instance, resources={"kmq": kmq}, raise_on_error=False)
        )

    runner = threading.Thread(target=run, daemon=True)
    runner.start()

    def running() -> str | None:
        runs = instance.get_runs()
        return runs[0].run_id if runs and HEARTBEAT_TAG in runs[0].tags else None

    assert wait_for(running, timeout_s=60)
    run_id = running()
    assert run_id is not None
    record = instance.get_run_by_id(run_id)
    assert record is not None
    instance.report_run_canceling(record)  # what Dagster's terminate writes before it signals

    runner.join(timeout=120)  # a heartbeat every 2 s, a commit and a close, the run's end
    assert not runner.is_alive(), "the tracker ran on after its run was terminated"
    (result,) = results
    assert result.dagster_run.status == DagsterRunStatus.CANCELED
    said = [entry.user_message for entry in instance.all_logs(run_id)]
    assert any("being terminated but no interrupt reached the tracker" in m for m in said), said
    assert any(": stopped in " in m and "group left" in m for m in said), said
