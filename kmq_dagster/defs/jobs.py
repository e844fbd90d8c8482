"""Jobs an operator launches from the Dagster UI.

No ``from __future__ import annotations`` here: Dagster reads op signatures at run time.
"""

from dagster import Config, JobDefinition, OpExecutionContext, job, op
from pydantic import Field

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.kafka.provision import ProvisionReport, provision_queue, provision_topic


class ProvisionConfig(Config):
    topic: str = Field(description="the queue topic")
    partitions: int | None = Field(
        default=None, description="partitions for new topics; default: the existing queue's"
    )
    group: str | None = Field(default=None, description="also create this group's topics")


def _log_report(context: OpExecutionContext, report: ProvisionReport) -> None:
    context.log.info(
        f"{len(report.created)} created, {len(report.unchanged)} already existed "
        f"({report.partitions} partitions): created {report.created}"
    )


@op
def provision_queue_topics(
    context: OpExecutionContext, config: ProvisionConfig, kmq: KmqResource
) -> list[str]:
    """Create the queue's topics (idempotent); returns the topics it created."""
    settings = kmq.get_settings()
    if config.group is None:
        report = provision_topic(settings, config.topic, partitions=config.partitions)
    else:
        queue = Queue(config.topic, config.group, partitions=config.partitions)
        report = provision_queue(settings, queue)
    _log_report(context, report)
    return report.created


@job(
    description="Create a queue topic, its delay queue, and a group's markers, redelivery, retry "
    "and DLQ topics."
)
def provision_job() -> None:
    provision_queue_topics()


def provision_declared_job(spec: QueueSpec) -> JobDefinition:
    """A job that provisions ``spec``'s queue exactly as declared; it needs no config."""

    @op(name=f"provision_{spec.name}_topics", tags=spec.tags)
    def provision_declared(context: OpExecutionContext, kmq: KmqResource) -> list[str]:
        report = provision_queue(kmq.get_settings(), spec.queue)
        _log_report(context, report)
        return report.created

    @job(
        name=spec.job_name("provision"),
        description=f"Create the topics of {spec.queue} and store its definition "
        f"({spec.queue.retry_policy.describe()}); idempotent.",
        tags=spec.tags,
    )
    def provision_declared_queue() -> None:
        provision_declared()

    return provision_declared_queue
