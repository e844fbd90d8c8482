"""Commands for dead letters: replay, ingest into the audit store, discard."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING

import click

from kmq_dagster.cli import signal_safe
from kmq_dagster.cli.app import cli, configure_logging, connection_options, settings_of, verbose
from kmq_dagster.cli.options import (
    DeadLetterSource,
    actor_option,
    audit_url_option,
    dead_letter_selection_options,
    dead_letter_source_options,
    default_actor,
    log_every,
    queue_options,
    stop_on_signals,
)
from kmq_dagster.cli.progress import LiveLine, log_file_for
from kmq_dagster.cli.value_types import Number
from kmq_dagster.core.replay import ReplaySelection, TimeBound, resolve_time
from kmq_dagster.core.replay_request import StopRequest
from kmq_dagster.core.terminal_text import escape_control
from kmq_dagster.core.wording import counted

if TYPE_CHECKING:
    from kmq_dagster.audit.models import Action
    from kmq_dagster.operations.replay import ReplayReport

#: Exit codes after a stop asked for by a signal: 128 + the signal's number.
EXIT_FOR_SIGNAL = {"SIGTERM": 128 + signal.SIGTERM, "Ctrl-C": 128 + signal.SIGINT}


class Signalled(BaseException):
    """A second SIGTERM or Ctrl-C: stop now (the action is recorded as stopped)."""


@contextmanager
def stopping_on_signals() -> Iterator[StopRequest]:
    """A stop request set by the first SIGTERM or Ctrl-C (the action finishes its step and
    records how it ended); the second one raises :class:`Signalled` at once."""
    stop = StopRequest()
    signal_safe.prepare()

    asked: list[str] = []  # not stop.is_set(): the event is set a moment after the signal

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if asked:
            raise Signalled(asked[0])
        asked.append("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")
        stop.reason = asked[0]
        signal_safe.set_soon(stop)  # not stop.set(): see signal_safe

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """SIGTERM and Ctrl-C raise :class:`Signalled` at once (for short, atomic actions)."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise Signalled("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def waiting_for(action: Action) -> None:
    """Say on stderr which running action this one waits for."""
    click.echo(
        f"kmq: waiting for action #{action.id} ({action.kind} of {action.queue_topic} / "
        f"{action.group_id} by {action.actor}, process {action.owner}) to end",
        err=True,
    )


def _quiet_logs(ctx: click.Context, command: str) -> None:
    """Components log to a file; the command's progress line is its report."""
    if not verbose(ctx):
        configure_logging(quiet=True, log_file=log_file_for(command))


@cli.command()
@dead_letter_source_options
@dead_letter_selection_options(offsets=True)
@click.option(
    "--to",
    "target",
    type=click.Choice(["retry", "original"]),
    default=None,
    help="retry: back to this group only (its redelivery topic, processed at once; never "
    "counted as a failure by the breaker); original: the queue topic (every group consuming "
    "it sees it again), or for --dlq-topic each dead letter's original topic "
    "[default: retry; original for --dlq-topic].",
)
@click.option("--to-topic", metavar="TOPIC", help="Send the copies to this topic instead.")
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
    source: DeadLetterSource,
    selection: ReplaySelection,
    target: str | None,
    to_topic: str | None,
    dry_run: bool,
    rate: float | None,
    max_replays: int,
    replay_id: str | None,
    actor: str | None,
    audit_url: str | None,
) -> int:
    """Send GROUP's dead letters of TOPIC (or those of --dlq-topic) back; run the same command
    again to resume."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters, target_topic

    _quiet_logs(ctx, "replay")
    settings = settings_of(ctx)
    target = target or ("original" if source.dlq_topic else "retry")
    request = ReplayRequest(
        selection,
        target=target,
        to_topic=to_topic,
        dry_run=dry_run,
        rate_per_s=rate,
        max_replays=max_replays,
        replay_id=replay_id,
    )
    opened = source.open(settings)
    queue = opened.queue
    goes_to = target if to_topic is None else target_topic(queue, request)
    progress = LiveLine()
    # The selection is typed by an operator, maybe pasted from message data: escaped too.
    header = [
        escape_control(f"replay {request.id_for(queue)}: {selection.describe()} -> {goes_to}")
    ]

    def introduce(report: ReplayReport) -> None:
        if header:  # once the replay is under way (bad requests fail before: one error line)
            progress.note(header.pop())
            if report.interrupted_before:
                progress.note(
                    f"the last run of this replay was interrupted ({report.interrupted_before})"
                )

    def show(report: ReplayReport) -> None:
        introduce(report)
        progress.update(f"scanned {report.scanned:,}, replayed {report.replayed:,}")

    store = AuditStore(audit_url)
    try:
        with stopping_on_signals() as stop:
            report = replay_dead_letters(
                opened,
                request,
                progress=show,
                audit=store,
                actor=actor or default_actor(),
                cancel=stop,
                on_wait=waiting_for,
            )
    except Signalled as exc:
        progress.done()
        click.echo(f"kmq: stopped by {exc}; the replay is recorded as stopped", err=True)
        return EXIT_FOR_SIGNAL[str(exc)]
    finally:
        progress.done()
        store.close()
    introduce(report)
    _print_report(report)
    return EXIT_FOR_SIGNAL[stop.reason] if report.cancelled else 0


def _print_report(report: ReplayReport) -> None:
    for line in report.listed:  # names a dead letter's error type: message data, escaped
        click.echo(f"  {escape_control(line)}")
    if report.dry_run and report.movable > len(report.listed):
        click.echo(f"  ... and {report.movable - len(report.listed)} more")
    click.echo(escape_control(report.summary()))  # counts by error type: message data


@cli.command()
@dead_letter_source_options
@click.option("--once", is_flag=True, help="Ingest what is there now, then exit.")
@audit_url_option
@connection_options
@click.pass_context
def ingest(
    ctx: click.Context,
    source: DeadLetterSource,
    once: bool,
    audit_url: str | None,
) -> None:
    """Copy GROUP's dead letters of TOPIC (or those of --dlq-topic, in its --format) into the
    audit store (idempotent; resumable)."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.operations.audited_ingest import run_ingest
    from kmq_dagster.operations.dlq_ingester import DlqIngester

    if once:
        _quiet_logs(ctx, "ingest")
    settings = settings_of(ctx)
    opened = source.open(settings)
    store = AuditStore(audit_url)
    ingester = DlqIngester(opened, store)
    try:
        stop = None if once else stop_on_signals()
        if stop is not None:
            log_every(stop, 5, ingester.describe_stats, "kmq.ingest")
            logging.getLogger("kmq.ingest").info(
                "ingesting %s into %s", ingester.dlq_topic, store.url_for_display
            )
        stats = run_ingest(ingester, store, actor=default_actor(), stop=stop)
    finally:
        if once:  # run() closes it itself
            ingester.close()
    click.echo(
        f"kmq ingest: {counted(stats.read, 'dead letter')} read, {stats.stored} new, "
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
) -> int:
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
    store = AuditStore(audit_url)
    try:
        with interrupted_by_signals():  # one transaction: all of it, or nothing
            count = store.discard(
                where, actor=actor or default_actor(), dry_run=dry_run, on_wait=waiting_for
            )
    except Signalled as exc:
        click.echo(f"kmq: stopped by {exc}; nothing was discarded", err=True)
        return EXIT_FOR_SIGNAL[str(exc)]
    finally:
        store.close()
    click.echo(f"{'would discard' if dry_run else 'discarded'} {counted(count, 'dead letter')}")
    return 0


def _moment(moment: TimeBound | None) -> datetime | None:
    """A resolved selection's time as a datetime (``None`` stays ``None``)."""
    return None if moment is None else datetime.fromtimestamp(resolve_time(moment, 0) / 1000, UTC)
