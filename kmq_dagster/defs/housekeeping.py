"""Schedules: processing on a cron, a daily audit retention job, a daily dead-letter digest.

No ``from __future__ import annotations`` here: Dagster reads op signatures at run time.
"""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import (
    Config,
    DefaultScheduleStatus,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from kmq_dagster.audit.housekeeping import apply_retention, dead_letter_counts
from kmq_dagster.core.wording import counted
from kmq_dagster.defs.alert_sinks import Alert
from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.operator_jobs import actor_of
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import AuditStoreResource

#: When the daily jobs run (cron, UTC).
DAILY_RETENTION_CRON = "30 3 * * *"
DAILY_DIGEST_CRON = "0 8 * * *"


def make_processing_schedule(
    spec: QueueSpec,
    cron: str,
    *,
    default_status: DefaultScheduleStatus = DefaultScheduleStatus.RUNNING,
) -> ScheduleDefinition:
    """Process ``spec``'s queue on a cron (``"*/15 * * * *"``), for users who prefer that to
    the backlog sensor; it runs the queue's ``process_<name>`` job with its defaults."""
    return ScheduleDefinition(
        name=spec.job_name("process_on_schedule"),
        job_name=spec.job_name("process"),
        cron_schedule=cron,
        default_status=default_status,
        tags=spec.tags,
        description=f"Processes {spec.queue} on {cron!r} (UTC).",
    )


class RetentionConfig(Config):
    retention_days: float = Field(default=90.0, description="keep this many days")
    archive_dir: str | None = Field(
        default=None, description="write removed rows here as JSON lines first; none: purge"
    )
    dry_run: bool = Field(default=False, description="count only")


@op
def apply_audit_retention(
    context: OpExecutionContext, config: RetentionConfig, audit: AuditStoreResource
) -> int:
    """Remove handled dead letters and actions older than the retention (itself audited)."""
    store = audit.get_store()
    cutoff = datetime.now(UTC) - timedelta(days=config.retention_days)
    archive = Path(config.archive_dir) if config.archive_dir else None
    report = apply_retention(
        store, cutoff, archive_dir=archive, dry_run=config.dry_run, actor=actor_of(context),
        selection=f"older than {config.retention_days:g} days",
    )  # fmt: skip
    context.log.info(report.describe())
    context.add_output_metadata(
        {
            "dead_letters_removed": MetadataValue.int(report.dead_letters),
            "actions_removed": MetadataValue.int(report.actions),
            "archive": MetadataValue.text(report.archive or "none (purged)"),
        }
    )
    return report.dead_letters + report.actions


#: Tags of the daily jobs' runs: a ``kmq/`` tag marks a run as kmq's (for the failure alerts).
HOUSEKEEPING_TAGS = {"kmq/housekeeping": "daily"}


@job(
    description="Remove handled dead letters and actions older than the retention.",
    tags=HOUSEKEEPING_TAGS,
)
def kmq_audit_retention() -> None:
    apply_audit_retention()


class DigestConfig(Config):
    hours: float = Field(default=24.0, description="count dead letters of this many hours")


@op
def send_dead_letter_digest(
    context: OpExecutionContext,
    config: DigestConfig,
    audit: AuditStoreResource,
    alerts: KmqAlertsResource,
) -> int:
    """Dead letters of the period by queue and cause: to the alert sinks and run metadata."""
    since = datetime.now(UTC) - timedelta(hours=config.hours)
    counts = dead_letter_counts(audit.get_store(), since)
    total = sum(n for *_rest, n in counts)
    lines = [f"{topic} / {group}: {n} x {cause}" for topic, group, cause, n in counts]
    context.add_output_metadata(
        {
            "dead_letters": MetadataValue.int(total),
            "by_queue_and_cause": MetadataValue.md(
                "| queue | group | cause | dead letters |\n|---|---|---|---|\n"
                + "\n".join(f"| {t} | {g} | {c} | {n} |" for t, g, c, n in counts)
            ),
        }
    )
    alert = Alert(
        kind="dead_letter_digest",
        severity="warning" if total else "info",
        subject="kmq dead letters",
        title=f"{counted(total, 'dead letter')} in the last {config.hours:g} h",
        text="; ".join(lines) or "none",
        key=f"digest:{since:%Y-%m-%dT%H}",
        details={"since": since.isoformat(), "counts": [list(c) for c in counts]},
    )
    alerts.send(alert, context.log)
    return total


@job(
    description="Counts of the day's dead letters by queue and cause, sent to the alert sinks.",
    tags=HOUSEKEEPING_TAGS,
)
def kmq_dead_letter_digest() -> None:
    send_dead_letter_digest()


def housekeeping_schedules(
    retention_cron: str = DAILY_RETENTION_CRON,
    digest_cron: str = DAILY_DIGEST_CRON,
    *,
    retention_status: DefaultScheduleStatus = DefaultScheduleStatus.STOPPED,
    digest_status: DefaultScheduleStatus = DefaultScheduleStatus.RUNNING,
) -> tuple[list[JobDefinition], list[ScheduleDefinition]]:
    """The retention and digest jobs with their daily schedules. Retention deletes data, so its
    schedule starts stopped unless ``retention_status`` says otherwise."""
    return [kmq_audit_retention, kmq_dead_letter_digest], [
        ScheduleDefinition(
            name="kmq_audit_retention_daily",
            job=kmq_audit_retention,
            cron_schedule=retention_cron,
            default_status=retention_status,
        ),
        ScheduleDefinition(
            name="kmq_dead_letter_digest_daily",
            job=kmq_dead_letter_digest,
            cron_schedule=digest_cron,
            default_status=digest_status,
        ),
    ]
