"""Jobs an operator launches from the Dagster UI.

No ``from __future__ import annotations`` here: Dagster reads op signatures at run time.
"""

from dagster import Config, OpExecutionContext, job, op
from pydantic import Field

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.kafka.provision import provision_queue, provision_topic


class ProvisionConfig(Config):
    topic: str = Field(description="the queue topic")
    partitions: int | None = Field(
        default=None, description="partitions for new topics; default: the existing queue's"
    )
    group: str | None = Field(default=None, description="also create this group's topics")


@op
def provision_queue_topics(
    context: OpExecutionContext, config: ProvisionConfig, kmq: KmqResource
) -> list[str]:
    """Create the queue's topics (idempotent); returns the topics it created."""
    settings = kmq.settings()
    if config.group is None:
        report = provision_topic(settings, config.topic, partitions=config.partitions)
    else:
        queue = Queue(config.topic, config.group, partitions=config.partitions)
        report = provision_queue(settings, queue)
    context.log.info(
        f"{len(report.created)} created, {len(report.unchanged)} already existed "
        f"({report.partitions} partitions): created {report.created}"
    )
    return report.created


@job(
    description="Create a queue topic, its delay queue, and a group's markers, redelivery, retry "
    "and DLQ topics."
)
def provision_job() -> None:
    provision_queue_topics()
