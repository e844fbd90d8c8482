"""The definitions load, every demo job launches without config, and provisioning jobs create
the queue's topics on the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from dagster import Definitions, validate_run_config

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.jobs import provision_job
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings


def test_every_demo_job_launches_with_no_config() -> None:
    from kmq_dagster.definitions import defs

    repository = defs.get_repository_def()
    names = sorted(job.name for job in repository.get_all_jobs() if not job.name.startswith("__"))
    assert names == [
        "discard_orders__pricing",
        "ingest_orders__pricing",
        "kmq_audit_retention",
        "kmq_dead_letter_digest",
        "process_orders__pricing",
        "provision_orders__pricing",
        "replay_orders__pricing",
        "track_orders__pricing",
    ]
    for name in names:
        validate_run_config(repository.get_job(name), {})  # raises if config is required
    sensors = sorted(sensor.name for sensor in repository.sensor_defs)
    assert sensors == [
        "backlog_orders__pricing",
        "breaker_orders__pricing",
        "keep_tracker_orders__pricing",
        "kmq_run_failures",
        "observe_orders__pricing",
    ]
    schedules = {s.name: s.default_status.value for s in repository.schedule_defs}
    assert schedules == {
        "kmq_audit_retention_daily": "STOPPED",  # it deletes rows: an operator turns it on
        "kmq_dead_letter_digest_daily": "RUNNING",
    }


def test_two_queues_with_one_dagster_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="give one of them QueueSpec"):
        kmq_definitions([QueueSpec(Queue("a.b", "c")), QueueSpec(Queue("a_b", "c"))])


def test_processing_needs_an_output_path() -> None:
    with pytest.raises(ConfigError, match="output_path"):
        QueueSpec(Queue("orders", "g"), function=print)


@pytest.mark.kafka
def test_the_declared_provision_job_stores_the_declared_queue(
    settings: KmqSettings, topic_name: str, kmq: KmqResource
) -> None:
    queue = Queue(topic_name, "dg", partitions=2, visibility_timeout_ms=5_000)
    defs = kmq_definitions([QueueSpec(queue)], kmq=kmq)

    result = defs.resolve_job_def(
        f"provision_{topic_name.replace('-', '_')}__dg"
    ).execute_in_process()

    assert result.success
    stored = open_queue(settings, topic_name, "dg")
    assert stored.queue.visibility_timeout_ms == 5_000
    assert stored.partitions == 2


@pytest.mark.kafka
def test_provision_job_creates_the_group_topics(
    settings: KmqSettings, topic_name: str, kmq: KmqResource
) -> None:
    job = Definitions(jobs=[provision_job], resources={"kmq": kmq}).resolve_job_def("provision_job")
    run_config = {
        "ops": {
            "provision_queue_topics": {
                "config": {"topic": topic_name, "partitions": 2, "group": "dg"}
            }
        }
    }

    result = job.execute_in_process(run_config=run_config)
    again = job.execute_in_process(run_config=run_config)

    assert result.success
    # the queue, markers, redelivery, 3 retry topics, DLQ: no delay queue unless asked for
    assert len(result.output_for_node("provision_queue_topics")) == 7
    assert again.output_for_node("provision_queue_topics") == []
    topics = AdminClient(settings.admin_config()).list_topics(timeout=10).topics
    assert f"{topic_name}.dg.markers" in topics
