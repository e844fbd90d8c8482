"""``kmq status``: what each provisioned queue and group is doing, for people or scripts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of
from kmq_dagster.cli.options import audit_url_option
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.status import QueueStatus
from kmq_dagster.core.wording import counted

if TYPE_CHECKING:
    from kmq_dagster.kafka.provision_plan import QueueFootprint


COLUMNS = (
    "QUEUE",
    "GROUP",
    "LAG",
    "IN FLIGHT",
    "OLDEST UNACKED",
    "RETRIES",
    "DLQ",
    "BREAKER",
    "PARTITIONS",
)


@cli.command()
@click.option("--topic", "-t", help="Only this queue topic.")
@click.option("--group", "-g", help="Only this consumer group.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per queue and group.")
@audit_url_option
@connection_options
@click.pass_context
def status(
    ctx: click.Context, topic: str | None, group: str | None, as_json: bool, audit_url: str | None
) -> None:
    """Lag, in flight, oldest unacknowledged age, retries, DLQ and breaker of every queue."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.kafka.provision_plan import partition_counts, queue_footprints
    from kmq_dagster.kafka.queues import open_queues
    from kmq_dagster.operations.queue_status import measure_queue

    settings = settings_of(ctx)
    queues = open_queues(settings, topic=topic, group=group)
    if not queues:
        raise click.ClickException(
            "no provisioned queue matches; `kmq provision --topic T --group G` defines one"
        )
    store = AuditStore(audit_url)
    statuses = [measure_queue(opened, store=store) for opened in queues]
    existing = partition_counts(settings)
    footprints = queue_footprints([opened.queue for opened in queues], existing)
    if as_json:
        for measured, footprint in zip(statuses, footprints, strict=True):
            click.echo(json.dumps({**as_dict(measured), **_footprint_dict(footprint)}))
        return
    rows = [COLUMNS, *map(_row, statuses, footprints)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo("  ".join(cells).rstrip())


def as_dict(measured: QueueStatus) -> dict[str, Any]:
    """A status as JSON: the totals and the per-topic figures."""
    return {
        "topic": measured.topic,
        "group": measured.group,
        "lag": measured.lag,
        "lag_by_partition": {str(p.partition): p.pending for p in measured.lags},
        "redelivery_lag": measured.redelivery_lag,
        "inflight": measured.inflight,
        "overdue": measured.overdue,
        "oldest_unacked_age_ms": measured.oldest_unacked_age_ms,
        "retry_depths": measured.retry_depths,
        "due_retries": measured.due_retries,
        "dlq_depth": measured.dlq_depth,
        "breaker": measured.breaker_state,
        "markers_complete": measured.markers_complete,
    }


def _footprint_dict(footprint: QueueFootprint) -> dict[str, Any]:
    """The queue's topics on the cluster (queue, delay queue, the group's) and their partitions;
    ``shared_topics`` false: a further group's row, which counts only the group's own."""
    return {
        "topics": list(footprint.topics),
        "topic_partitions": footprint.partitions,
        "shared_topics": footprint.shared,
    }


def _row(measured: QueueStatus, footprint: QueueFootprint) -> tuple[str, ...]:
    age = measured.oldest_unacked_age_ms
    retries = sum(measured.retry_depths.values())
    return (
        measured.topic,
        measured.group,
        f"{measured.lag:,}",
        f"{measured.inflight:,}" + ("" if measured.markers_complete else "+"),
        "-" if age is None else format_duration_ms(age - age % 1000 if age >= 1000 else age),
        f"{retries:,} ({measured.due_retries:,} due)" if retries else "0",
        f"{measured.dlq_depth:,}",
        measured.breaker_state,
        ("" if footprint.shared else "+")
        + f"{footprint.partitions:,} in {counted(len(footprint.topics), 'topic')}",
    )
