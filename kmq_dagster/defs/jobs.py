"""Jobs an operator launches from the Dagster UI.

No ``from __future__ import annotations`` here: Dagster reads op signatures at run time.
"""

from dagster import Config, JobDefinition, MetadataValue, OpExecutionContext, job, op
from pydantic import Field

from kmq_dagster.core.delay import parse_delay_levels
from kmq_dagster.core.durations import parse_duration_ms
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_settings import PARTITIONS
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs.queue_spec import QueueSpec, queue_job
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.provision import ProvisionReport, provision_queue, provision_topic
from kmq_dagster.settings import parse_delay_list


class DelayQueueConfig(Config):
    """Whether provisioning creates the delay queue, and its levels (both provision jobs)."""

    delays: bool = Field(
        default=False,
        description="also create the delay queue (T.delay.*) that sending with a delay needs",
    )
    delay_levels: str | None = Field(
        default=None,
        description="with delays: the delay ladder's levels, e.g. 1s,30s,5m,1h (default: the "
        "existing delay queue's, else 1s,5s,30s,2m,10m,1h,6h,1d)",
    )


class ProvisionConfig(DelayQueueConfig):
    topic: str = Field(description="the queue topic")
    partitions: int | None = Field(
        default=None, description=f"{PARTITIONS.help}; default: the existing queue's"
    )
    group: str | None = Field(default=None, description="also create this group's topics")


def _log_report(context: OpExecutionContext, report: ProvisionReport) -> None:
    """Log what was done; the plan carried out (every topic, the partition totals) goes into
    the output's metadata, as `kmq provision --plan --json` prints it."""
    context.log.info(
        f"{len(report.created)} created, {len(report.unchanged)} already existed "
        f"({report.partitions} partitions): created {report.created}"
    )
    if report.plan is not None:
        plan = report.plan
        context.add_output_metadata(
            {
                "plan": MetadataValue.json(plan.as_dict()),
                "created_partitions": plan.created_partitions,
                "queue_topics": len(plan.topics),
                "queue_partitions": plan.queue_partitions,
            }
        )


def _levels(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else parse_delay_levels(text)


@op
def provision_queue_topics(
    context: OpExecutionContext, config: ProvisionConfig, kmq: KmqResource
) -> list[str]:
    """Create the queue's topics (idempotent); returns the topics it created."""
    settings = kmq.get_settings()
    if config.group is None:
        report = provision_topic(
            settings,
            config.topic,
            partitions=config.partitions,
            delay_queue=config.delays,
            delay_levels_ms=_levels(config.delay_levels),
        )
    else:
        queue = Queue(config.topic, config.group, partitions=config.partitions)
        report = provision_queue(
            settings,
            queue,
            delay_queue=config.delays,
            delay_levels_ms=_levels(config.delay_levels),
        )
    _log_report(context, report)
    return report.created


@job(
    description="Create a queue topic (its delay queue with delays=true), and a group's markers, "
    "redelivery, retry and DLQ topics."
)
def provision_job() -> None:
    provision_queue_topics()


class DeclaredProvisionConfig(DelayQueueConfig):
    """Changes to the declared queue; none given: provision it exactly as declared."""

    retry_delays: str | None = Field(
        default=None, description="retry delays, e.g. 10s,1m,10m (replaces the declared ones)"
    )
    visibility_timeout: str | None = Field(default=None, description="e.g. 30s")
    max_redeliveries: int | None = Field(default=None)
    redefine: bool = Field(
        default=False, description="store these values although the queue is defined otherwise"
    )


def provision_declared_job(spec: QueueSpec) -> JobDefinition:
    """A job that provisions ``spec``'s queue as declared (no config needed), or with a new
    retry policy, visibility timeout or max redeliveries; the change is audited."""

    @op(name=f"provision_{spec.name}_topics", tags=spec.tags)
    def provision_declared(
        context: OpExecutionContext,
        config: DeclaredProvisionConfig,
        kmq: KmqResource,
        audit: AuditStoreResource,
    ) -> list[str]:
        queue = spec.queue
        if config.retry_delays is not None:
            queue = queue.replace(
                retry_policy=RetryPolicy.fixed(parse_delay_list(config.retry_delays))
            )
        if config.visibility_timeout is not None:
            queue = queue.replace(
                visibility_timeout_ms=parse_duration_ms(config.visibility_timeout)
            )
        if config.max_redeliveries is not None:
            queue = queue.replace(max_redeliveries=config.max_redeliveries)
        report = provision_queue(
            kmq.get_settings(),
            queue,
            redefine=config.redefine,
            delay_queue=config.delays,
            delay_levels_ms=_levels(config.delay_levels),
        )
        _log_report(context, report)
        audit.get_store().record_action(
            kind="provision",
            actor=context.run.tags.get("kmq/actor") or f"dagster run {context.run_id}",
            queue_topic=queue.topic,
            group_id=queue.group,
            selection=queue.retry_policy.describe(),
            count=len(report.created),
            target=None,
            dry_run=False,
            outcome=f"created {len(report.created)} topics; {len(report.unchanged)} existed",
        )
        return report.created

    return queue_job(
        spec,
        "provision",
        provision_declared,
        description=f"Create the topics of {spec.queue} and store its definition "
        f"({spec.queue.retry_policy.describe()}); idempotent.",
    )
