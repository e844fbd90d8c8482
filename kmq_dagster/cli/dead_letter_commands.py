"""Commands for dead letters: replay, ingest into the audit store, discard."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import click

from kmq_dagster.cli.app import cli, configure_logging, connection_options, settings_of, verbose
from kmq_dagster.cli.options import (
    actor_option,
    audit_url_option,
    dead_letter_selection_options,
    default_actor,
    log_every,
    queue_options,
    stop_on_signals,
)
from kmq_dagster.cli.progress import LiveLine, log_file_for
from kmq_dagster.cli.value_types import Number
from kmq_dagster.core.replay import ReplaySelection, TimeBound, resolve_time
from kmq_dagster.core.terminal_text import escape_control
from kmq_dagster.kafka.replay import ReplayReport, ReplayRequest


def _quiet_logs(ctx: click.Context, command: str) -> None:
    """Components log to a file; the command's progress line is its report."""
    if not verbose(ctx):
        configure_logging(quiet=True, log_file=log_file_for(command))


@cli.command()
@queue_options
@dead_letter_selection_options(offsets=True)
@click.option(
    "--to",
    "target",
    type=click.Choice(["retry", "original"]),
    default="retry",
    show_default=True,
    help="retry: the group's first retry topic (only this group sees it); original: the "
    "queue topic (every group consuming it sees it again).",
)
@click.option("--dry-run", is_flag=True, help="Show what would move; move nothing (audited).")
@click.option("--rate", type=Number(0, low_open=True), help="Copies per second at most.")
@click.option(
    "--max-replays",
    type=click.IntRange(1, 1000),
    default=3,
    show_default=True,
    help="Skip dead letters already replayed this many times.",
)
@click.option(
    "--replay-id",
    help="Name of this replay; rerunning it resumes [default: derived "
    "from the queue, selection and target].",
)
@actor_option
@audit_url_option
@connection_options
@click.pass_context
def replay(
    ctx: click.Context,
    topic: str,
    group: str,
    selection: ReplaySelection,
    target: str,
    dry_run: bool,
    rate: float | None,
    max_replays: int,
    replay_id: str | None,
    actor: str | None,
    audit_url: str | None,
) -> None:
    """Send GROUP's dead letters of TOPIC back; run the same command again to resume."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.kafka.queues import open_queue
    from kmq_dagster.kafka.replay import replay_dead_letters

    _quiet_logs(ctx, "replay")
    settings = settings_of(ctx)
    request = ReplayRequest(
        selection,
        target=target,
        dry_run=dry_run,
        rate_per_s=rate,
        max_replays=max_replays,
        replay_id=replay_id,
    )
    opened = open_queue(settings, topic, group)
    queue = opened.queue
    progress = LiveLine()
    header = [f"replay {request.id_for(queue)}: {selection.describe()} -> {target}"]

    def show(report: ReplayReport) -> None:
        if header:  # once the replay is under way (bad requests fail before: one error line)
            progress.note(header.pop())
        progress.update(f"scanned {report.scanned:,}, replayed {report.replayed:,}")

    try:
        report = replay_dead_letters(
            opened,
            request,
            progress=show,
            audit=AuditStore(audit_url),
            actor=actor or default_actor(),
        )
    finally:
        progress.done()
    if header:
        progress.note(header.pop())
    _print_report(report)


def _print_report(report: ReplayReport) -> None:
    for line in report.listed:  # names a dead letter's error type: message data, escaped
        click.echo(f"  {escape_control(line)}")
    if report.dry_run and report.movable > len(report.listed):
        click.echo(f"  ... and {report.movable - len(report.listed)} more")
    click.echo(escape_control(report.summary()))  # counts by error type: message data


@cli.command()
@queue_options
@click.option("--once", is_flag=True, help="Ingest what is there now, then exit.")
@audit_url_option
@connection_options
@click.pass_context
def ingest(
    ctx: click.Context,
    topic: str,
    group: str,
    once: bool,
    audit_url: str | None,
) -> None:
    """Copy GROUP's dead letters of TOPIC into the audit store (idempotent; resumable)."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.kafka.dlq_ingester import DlqIngester
    from kmq_dagster.kafka.queues import open_queue

    if once:
        _quiet_logs(ctx, "ingest")
    settings = settings_of(ctx)
    store = AuditStore(audit_url)
    ingester = DlqIngester(open_queue(settings, topic, group), store)
    if once:
        try:
            stats = ingester.ingest_available()
        finally:
            ingester.close()
    else:
        stop = stop_on_signals()
        log_every(stop, 5, ingester.describe_stats, "kmq.ingest")
        logging.getLogger("kmq.ingest").info(
            "ingesting %s into %s", ingester.dlq_topic, store.url_for_display
        )
        ingester.run(stop)
        stats = ingester.stats
    click.echo(
        f"kmq ingest: {stats.read} dead letters read, {stats.stored} new, "
        f"{stats.already_stored} already stored, in {store.url_for_display}"
    )


@cli.command()
@queue_options
@dead_letter_selection_options(offsets=False)
@click.option("--dry-run", is_flag=True, help="Count what would be discarded; change nothing.")
@actor_option
@audit_url_option
def discard(
    topic: str,
    group: str,
    selection: ReplaySelection,
    dry_run: bool,
    actor: str | None,
    audit_url: str | None,
) -> None:
    """Mark GROUP's stored dead letters of TOPIC as discarded: replays skip them (audited)."""
    from kmq_dagster.audit.store import AuditStore, DeadLetterFilter
    from kmq_dagster.kafka.clients import wall_clock_ms

    resolved = selection.resolved(wall_clock_ms())
    where = DeadLetterFilter(
        queue_topic=topic,
        group_id=group,
        error_type=resolved.error_type,
        key=resolved.key,
        since=_moment(resolved.since),
        until=_moment(resolved.until),
    )
    count = AuditStore(audit_url).discard(where, actor=actor or default_actor(), dry_run=dry_run)
    click.echo(f"{'would discard' if dry_run else 'discarded'} {count} dead letters")


def _moment(moment: TimeBound | None) -> datetime | None:
    """A resolved selection's time as a datetime (``None`` stays ``None``)."""
    return None if moment is None else datetime.fromtimestamp(resolve_time(moment, 0) / 1000, UTC)
