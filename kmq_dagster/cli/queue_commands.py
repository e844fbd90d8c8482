"""Commands that create and work a queue: provision, worker, tracker, delayer."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of
from kmq_dagster.cli.breaker_options import BreakerOptions, breaker_options
from kmq_dagster.cli.crash_guard import crash_guarded
from kmq_dagster.cli.options import (
    audit_url_option,
    concurrency_options,
    log_every,
    metrics_port_option,
    non_retryable_option,
    queue_options,
    serve_metrics_of,
    stop_exit_code,
    stop_on_signals,
    topic_option,
)
from kmq_dagster.cli.queue_definition_options import DefinitionOptions, definition_options
from kmq_dagster.cli.setting_options import setting_option
from kmq_dagster.cli.stop_deadline import exit_if_still_calling
from kmq_dagster.cli.value_types import Number
from kmq_dagster.core.delay import DEFAULT_DELAY_LEVELS_MS, MAX_DELAY_LEVELS, parse_delay_levels
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.queue_settings import MAX_PARTITIONS, PARTITIONS, short_visibility_warning
from kmq_dagster.core.wording import counted
from kmq_dagster.kafka.provision import ProvisionPlan, ProvisionReport
from kmq_dagster.settings import MAX_BATCH_SIZE
from kmq_dagster.worker.garbage_collection import GC_FIRST_THRESHOLD

#: Largest --max-buffered: the worker's memory bound (invariant 11) must stay a bound.
MAX_BUFFERED = 1_000_000
#: The highest ``--gc-threshold`` (far above anything useful: a typo, not a choice).
MAX_GC_THRESHOLD = 100_000_000
#: Longest --drain-timeout: an hour; a stop that waits longer is a hang.
MAX_DRAIN_TIMEOUT_S = 3600

log = logging.getLogger("kmq.cli")
#: The default delay ladder as `--delay-levels` would take it.
DEFAULT_LADDER = ",".join(format_duration_ms(level_ms) for level_ms in DEFAULT_DELAY_LEVELS_MS)


@cli.command()
@topic_option
@setting_option(
    PARTITIONS,
    short="-p",
    help=f"Partitions for new topics, at most {MAX_PARTITIONS:,} (default: the existing queue "
    "topic's).",
)
@click.option(
    "--group", "-g", help="Consumer group: also create its markers, retry and DLQ topics."
)
@definition_options
@click.option(
    "--replication-factor",
    type=click.IntRange(-1, 100),
    default=-1,
    show_default=True,
    help="Replicas per partition; -1 lets the cluster decide.",
)
@click.option(
    "--min-insync-replicas",
    type=click.IntRange(1, 100),
    help="Replicas that must have a write before it counts (with acks=all) [default: the "
    "cluster's].",
)
@click.option(
    "--delays/--no-delays",
    "--delay-queue/--no-delay-queue",
    "delay_queue",
    default=False,
    show_default=True,
    help="Also create the delay queue that `kmq send --delay` needs: a topic `T.delay.<level>` "
    "per delay level and `T.delay.dlq`; without it nothing is deleted, an existing delay queue "
    "keeps working.",
)
@click.option(
    "--delay-levels",
    metavar="LEVELS",
    help="With --delays: the delay ladder's levels, e.g. 1s,30s,5m,1h (1s to 7d, at most "
    f"{MAX_DELAY_LEVELS}) [default: the existing delay queue's, else {DEFAULT_LADDER}]. A delay "
    "shorter than the smallest level waits that level; an existing ladder is never changed.",
)
@click.option(
    "--redefine",
    is_flag=True,
    help="Change the stored definition (retry policy, timeouts) of an existing queue.",
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Create nothing: print every topic provisioning would create or find, with its "
    "partitions, replication and settings, and the partition totals.",
)
@click.option("--json", "as_json", is_flag=True, help="With --plan: one JSON object, for scripts.")
@connection_options
@click.pass_context
def provision(
    ctx: click.Context,
    topic: str,
    partitions: int | None,
    group: str | None,
    definition: DefinitionOptions,
    replication_factor: int,
    min_insync_replicas: int | None,
    delay_queue: bool,
    delay_levels: str | None,
    redefine: bool,
    plan_only: bool,
    as_json: bool,
) -> None:
    """Create the queue topic and the group's topics, idempotently; store the queue's
    definition so other commands need not repeat it."""
    from kmq_dagster.kafka.provision import (
        plan_queue,
        plan_topic,
        provision_queue,
        provision_topic,
    )

    if as_json and not plan_only:
        raise click.UsageError("--json goes with --plan")
    if delay_levels is not None and not delay_queue:
        raise click.UsageError("--delay-levels goes with --delays")
    if replication_factor == 0:
        raise click.BadParameter(
            "0 replicas is not a thing: give -1 or at least 1", param_hint="--replication-factor"
        )
    settings = settings_of(ctx)
    layout: dict[str, Any] = {
        "replication_factor": replication_factor,
        "min_insync_replicas": min_insync_replicas,
        "delay_queue": delay_queue,
        "delay_levels_ms": None if delay_levels is None else parse_delay_levels(delay_levels),
    }
    if group is None:
        if definition != DefinitionOptions():
            raise click.UsageError(
                "retry, visibility and format options belong to a group: add --group"
            )
        if plan_only:
            _print_plan(plan_topic(settings, topic, partitions=partitions, **layout), as_json)
            return
        report = provision_topic(settings, topic, partitions=partitions, **layout)
    else:
        queue = definition.new_queue(settings, topic, group, partitions)
        short = short_visibility_warning(queue.visibility_timeout_ms)
        if short is not None:
            click.echo(f"kmq: warning: {short}", err=True)
        if plan_only:
            _print_plan(plan_queue(settings, queue, redefine=redefine, **layout), as_json)
            return
        report = provision_queue(settings, queue, redefine=redefine, **layout)
    _print_provision_report(report)


def _print_plan(plan: ProvisionPlan, as_json: bool) -> None:
    from kmq_dagster.kafka.provision_plan import describe_plan

    if as_json:
        click.echo(json.dumps(plan.as_dict()))
    else:
        click.echo("\n".join(describe_plan(plan)))


def _print_provision_report(report: ProvisionReport) -> None:
    total = len(report.created) + len(report.unchanged)
    if not report.changed:
        click.echo(
            f"nothing to change: all {total} topics already exist "
            f"with {report.partitions} partitions"
        )
        return
    planned = {t.name: t.partitions for t in report.plan.all_topics} if report.plan else {}
    for name in report.created:
        click.echo(f"created  {name} ({planned.get(name, report.partitions)} partitions)")
    for name in report.unchanged:
        click.echo(f"exists   {name}")
    stored = "; definition stored" if report.defined else ""
    click.echo(f"provisioned {total} topics: {len(report.created)} created{stored}")


@cli.command()
@queue_options
@click.option(
    "--handler",
    required=True,
    metavar="MODULE:FUNCTION",
    help="Called per message; the current directory is importable.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH_SIZE),
    help="Messages per fetch [env KMQ_BATCH_SIZE; default 500].",
)
@concurrency_options(
    concurrency_help="Handler calls at once: threads for a sync handler, tasks on one event "
    "loop for an async one.",
    ordering_help="One call per partition at a time, never two of one key at once (failures "
    "retried in place, later messages of the key wait), or none.",
)
@click.option(
    "--max-buffered",
    type=click.IntRange(1, MAX_BUFFERED),
    help="Fetched messages waiting to start before fetching pauses, at most "
    f"{MAX_BUFFERED:,} [default: max(4 * concurrency, 100); at --concurrency 1, one fetch].",
)
@click.option(
    "--drain-timeout",
    type=Number(0, MAX_DRAIN_TIMEOUT_S),
    default=30.0,
    show_default=True,
    help="Seconds a stopping worker waits for running calls (at any concurrency); those "
    "still running are redelivered after their visibility timeout.",
)
@click.option(
    "--extend-running/--no-extend-running",
    default=True,
    show_default=True,
    help="With --concurrency above 1: keep extending the visibility of a message whose call "
    "is still running; off, a call that outlives the visibility timeout is redelivered.",
)
@click.option(
    "--gc-threshold",
    type=click.IntRange(0, MAX_GC_THRESHOLD),
    default=GC_FIRST_THRESHOLD,
    show_default=True,
    help="Python's garbage collector's first threshold while the worker runs, if the process "
    "has a lower one (CPython's is 700): calls in flight keep many short-lived objects alive. "
    "0 leaves the collector alone.",
)
@breaker_options
@audit_url_option
@non_retryable_option
@metrics_port_option
@connection_options
@click.pass_context
@crash_guarded
def worker(
    ctx: click.Context,
    topic: str,
    group: str,
    handler: str,
    batch_size: int | None,
    concurrency: int,
    ordering: str,
    max_buffered: int | None,
    drain_timeout: float,
    extend_running: bool,
    gc_threshold: int,
    breaker: BreakerOptions,
    audit_url: str | None,
    non_retryable: str,
    metrics_port: int | None,
) -> int:
    """Consume TOPIC in GROUP: returning acknowledges a message, raising retries it later."""
    from kmq_dagster.kafka.queues import open_queue
    from kmq_dagster.worker.worker import HandlerExit, Worker, WorkerStats, load_handler

    settings = settings_of(ctx)
    function = load_handler(handler)
    opened = open_queue(settings, topic, group).with_non_retryable(non_retryable.split(","))
    queue = opened.queue
    service = Worker(
        opened,
        function,
        breaker=breaker.build(queue, audit_url),
        batch_size=batch_size,
        concurrency=concurrency,
        ordering=ordering,
        max_buffered=max_buffered,
        drain_timeout_s=drain_timeout,
        extend_running=extend_running,
        gc_threshold=gc_threshold or None,
    )
    from kmq_dagster.metrics import worker_snapshot

    metrics = serve_metrics_of(
        metrics_port, "worker", queue.topic, queue.group, lambda: worker_snapshot(service)
    )
    stop = stop_on_signals()
    finished = threading.Event()
    if concurrency == 1:  # above 1, calls run on threads of their own: the drain cuts them off
        exit_if_still_calling(
            stop, finished, drain_timeout, lambda: service.stats.calls_in_flight, stop_exit_code
        )
    log.info("worker for %s started", queue)
    last_report = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if time.monotonic() - last_report[0] >= 5:
            last_report[0] = time.monotonic()
            log.info("handled %d, failed %d", stats.handled, stats.failed)

    try:
        stats = service.run(stop, on_batch=report)
    except HandlerExit as exit_:
        click.echo(f"kmq worker: stopped: {exit_}", err=True)
        return exit_.code
    finally:
        finished.set()
        if metrics is not None:
            metrics.close()
    click.echo(f"kmq worker: stopped after {stats.handled} handled, {stats.failed} failed")
    return 0


@cli.command()
@queue_options
@metrics_port_option
@connection_options
@click.pass_context
@crash_guarded
def tracker(ctx: click.Context, topic: str, group: str, metrics_port: int | None) -> int:
    """Redeliver GROUP's messages of TOPIC that were not acknowledged in time."""
    from kmq_dagster.kafka.clients import wall_clock_ms
    from kmq_dagster.kafka.queues import open_queue
    from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
    from kmq_dagster.metrics import tracker_snapshot

    settings = settings_of(ctx)
    service = RedeliveryTracker(open_queue(settings, topic, group))
    metrics = serve_metrics_of(
        metrics_port, "tracker", topic, group, lambda: tracker_snapshot(service, wall_clock_ms())
    )
    log.info("tracker for %s started", service.queue)
    _run_until_signalled(service.run, service.describe_stats, "kmq.tracker", metrics)
    click.echo(
        "kmq tracker: stopped after "
        + counted(service.stats.redelivered, "redelivery", "redeliveries")
    )
    return 0


@cli.command()
@topic_option
@metrics_port_option
@connection_options
@click.pass_context
def delayer(ctx: click.Context, topic: str, metrics_port: int | None) -> None:
    """Deliver TOPIC's delayed messages when due (several may run; partitions are shared)."""
    from kmq_dagster.kafka.delay_forwarder import DelayForwarder, delayer_group
    from kmq_dagster.metrics import delayer_snapshot

    forwarder = DelayForwarder(settings_of(ctx), topic)
    metrics = serve_metrics_of(
        metrics_port, "delayer", topic, delayer_group(topic), lambda: delayer_snapshot(forwarder)
    )
    log.info("delay forwarder for %s started", topic)
    _run_until_signalled(forwarder.run, forwarder.describe_stats, "kmq.delayer", metrics)
    click.echo(
        f"kmq delayer: stopped after {counted(forwarder.stats.delivered, 'delivery', 'deliveries')}"
    )


def _run_until_signalled(
    run: Callable[[threading.Event], None],
    describe_stats: Callable[[], str],
    logger: str,
    metrics: Any,
) -> None:
    """Run a long-lived component until SIGTERM or Ctrl-C, logging its counters on ``logger``
    every 5 s; its metrics server (``None``: none) stops with it, however ``run`` ends."""
    stop = stop_on_signals()
    log_every(stop, 5, describe_stats, logger)
    try:
        run(stop)
    finally:
        if metrics is not None:
            metrics.close()
