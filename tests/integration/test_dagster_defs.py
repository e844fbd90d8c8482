"""The Dagster definitions load, and the provisioning job creates topics on the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.settings import KmqSettings


def test_definitions_load_with_the_provision_job() -> None:
    from kmq_dagster.definitions import defs

    assert defs.resolve_job_def("provision_job").name == "provision_job"


@pytest.mark.kafka
def test_provision_job_creates_the_group_topics(settings: KmqSettings, topic_name: str) -> None:
    from kmq_dagster.definitions import defs

    job = defs.resolve_job_def("provision_job")
    run_config = {
        "ops": {
            "provision_queue_topics": {
                "config": {"topic": topic_name, "partitions": 2, "group": "dg"}
            }
        }
    }
    resources = {"kmq": KmqResource(bootstrap_servers=settings.bootstrap_servers)}

    result = job.execute_in_process(run_config=run_config, resources=resources)
    again = job.execute_in_process(run_config=run_config, resources=resources)

    assert result.success
    assert len(result.output_for_node("provision_queue_topics")) == 16  # with the delay queue
    assert again.output_for_node("provision_queue_topics") == []
    topics = AdminClient(settings.admin_config()).list_topics(timeout=10).topics
    assert f"{topic_name}.dg.markers" in topics
