"""The ``kmq`` command. Its subcommands and their output are a public interface."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

import click

from kmq_dagster.bench.common import Cluster
from kmq_dagster.core.durations import parse_duration_ms
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import BrokerError, ConfigError, KmqError
from kmq_dagster.settings import (
    DEFAULT_BROKER_PORT,
    KmqSettings,
    parse_client_options,
    parse_delay_list,
)

#: Attempts in all (the first delivery included) under --retry-backoff unless --max-attempts.
DEFAULT_BACKOFF_ATTEMPTS = 5


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--bootstrap-servers",
    "-b",
    metavar="HOST:PORT",
    help="Kafka to use [env KMQ_BOOTSTRAP_SERVERS; default: the embedded broker, 127.0.0.1:9092]",
)
@click.option(
    "-X",
    "client_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="confluent-kafka setting, e.g. -X security.protocol=SASL_SSL [env KMQ_KAFKA_*]",
)
@click.option("--verbose", "-v", is_flag=True, help="Show debug logs and the Kafka client's.")
@click.pass_context
def cli(
    ctx: click.Context,
    bootstrap_servers: str | None,
    client_options: tuple[str, ...],
    verbose: bool,
) -> None:
    """A reliable work queue on Kafka: per-message ack, redelivery, retries, DLQ."""
    _configure_logging(verbose)
    ctx.obj = KmqSettings.from_env(
        bootstrap_servers=bootstrap_servers,
        client_config=parse_client_options(client_options),
    )


@cli.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_BROKER_PORT,
    show_default=True,
    help="Loopback port to serve Kafka on; 0 picks a free one.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep topics, messages and offsets here across restarts (default: in memory).",
)
def broker(port: int, data_dir: Path | None) -> None:
    """Run the embedded Kafka-compatible broker in the foreground until Ctrl-C or SIGTERM."""
    from kmq_dagster.broker import EmbeddedBroker

    stop_requested = _stop_on_signals()
    embedded = EmbeddedBroker(port=port, data_dir=data_dir)
    try:
        embedded.start()
        click.echo(
            f"kmq broker: serving Kafka on {embedded.bootstrap_servers}, "
            f"storage {embedded.storage_description}; Ctrl-C stops it"
        )
        click.echo(f"export KMQ_BOOTSTRAP_SERVERS={embedded.bootstrap_servers}")
        sys.stdout.flush()
        while not stop_requested.wait(0.5):
            failure = embedded.failed_child()
            if failure:
                raise BrokerError(f"the broker stopped unexpectedly: {failure}")
    finally:
        embedded.stop()
    click.echo("kmq broker: stopped")


_audit_url_option = click.option(
    "--audit-url",
    metavar="URL",
    help="SQLAlchemy URL of the audit store [env KMQ_AUDIT_URL; default sqlite:///~/.kmq/audit.db].",
)


_actor_option = click.option(
    "--actor", default=None, help="Who runs it, for the audit log [default: user@host]."
)


_ERROR_TYPE_HELP = "Only this exception type, e.g. TimeoutError."
_SINCE_HELP = "Dead-lettered at or after: ISO time or e.g. 2h ago."
_UNTIL_HELP = "Dead-lettered before: ISO time or a duration ago."
#: Which dead letters replay and discard touch, in the order --help lists them.
_DEAD_LETTER_SELECTION = (
    click.option("--key", "-k", help="Only dead letters with this key."),
    click.option("--error-type", metavar="NAME", help=_ERROR_TYPE_HELP),
    click.option("--since", metavar="TIME", help=_SINCE_HELP),
    click.option("--until", metavar="TIME", help=_UNTIL_HELP),
)


def _dead_letter_selection_options(command: Callable[..., None]) -> Callable[..., None]:
    """--key, --error-type, --since and --until on ``command``."""
    for option in reversed(_DEAD_LETTER_SELECTION):
        command = option(command)
    return command


@dataclasses.dataclass(frozen=True)
class RetryOptions:
    """The retry policy flags shared by provision, worker and replay (they must agree)."""

    delays: str | None
    backoff: str | None
    max_attempts: int | None
    jitter: float

    def policy(self, settings: KmqSettings, non_retryable: Sequence[str] = ()) -> RetryPolicy:
        """The policy these flags describe; default: ``settings.retry_delays_ms``."""
        if self.backoff is not None:
            if self.delays is not None:
                raise ConfigError("give --retry-delays or --retry-backoff, not both")
            return RetryPolicy.exponential(
                self.backoff,
                max_attempts=self.max_attempts or DEFAULT_BACKOFF_ATTEMPTS,
                jitter=self.jitter,
                non_retryable=non_retryable,
            )
        if self.max_attempts is not None:
            raise ConfigError(
                "--max-attempts goes with --retry-backoff; with --retry-delays every delay is "
                "one retry"
            )
        delays_ms = parse_delay_list(self.delays) if self.delays else settings.retry_delays_ms
        return RetryPolicy(
            delays_ms=delays_ms, jitter=self.jitter, non_retryable=frozenset(non_retryable)
        )


def _retry_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the retry policy flags; the command receives them as ``retry: RetryOptions``."""

    @functools.wraps(command)
    def with_retry(
        *args: object,
        retry_delays: str | None,
        retry_backoff: str | None,
        max_attempts: int | None,
        retry_jitter: float,
        **kwargs: object,
    ) -> None:
        retry = RetryOptions(retry_delays, retry_backoff, max_attempts, retry_jitter)
        command(*args, retry=retry, **kwargs)

    options = [
        click.option(
            "--retry-delays",
            metavar="LIST",
            help="Delay before each retry, one retry topic per distinct delay, e.g. 10s,1m,10m "
            "[env KMQ_RETRY_DELAYS; default 10s,1m,10m].",
        ),
        click.option(
            "--retry-backoff",
            metavar="INITIAL,MULTIPLIER,MAX",
            help="Exponential backoff instead of --retry-delays, e.g. 1s,2,10m.",
        ),
        click.option(
            "--max-attempts",
            type=click.IntRange(min=1),
            help=f"Attempts in all with --retry-backoff [default {DEFAULT_BACKOFF_ATTEMPTS}].",
        ),
        click.option(
            "--retry-jitter",
            type=click.FloatRange(0, 1, max_open=True),
            default=0.0,
            show_default=True,
            help="Spread each due time by up to this share of its delay.",
        ),
    ]
    for option in reversed(options):
        with_retry = option(with_retry)
    return with_retry


@cli.command()
@click.option("--topic", "-t", required=True, help="The queue topic.")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(min=1),
    help="Partitions for new topics (default: the existing queue topic's).",
)
@click.option(
    "--group", "-g", help="Consumer group: also create its markers, retry and DLQ topics."
)
@_retry_options
@click.option(
    "--replication-factor",
    type=int,
    default=-1,
    show_default=True,
    help="Replicas per partition; -1 lets the cluster decide.",
)
@click.option(
    "--delay-queue/--no-delay-queue",
    default=True,
    show_default=True,
    help="Create the delay-level topics that `kmq send --delay` uses.",
)
@click.pass_obj
def provision(
    settings: KmqSettings,
    topic: str,
    partitions: int | None,
    group: str | None,
    retry: RetryOptions,
    replication_factor: int,
    delay_queue: bool,
) -> None:
    """Create the queue topic and the group's topics, idempotently."""
    from kmq_dagster.kafka.provision import provision_queue

    report = provision_queue(
        settings,
        topic,
        partitions=partitions,
        group=group,
        retry_delays_ms=tuple(retry.policy(settings).topic_delays_ms()),
        replication_factor=replication_factor,
        delay_queue=delay_queue,
    )
    total = len(report.created) + len(report.unchanged)
    if not report.changed:
        click.echo(
            f"nothing to change: all {total} topics already exist "
            f"with {report.partitions} partitions"
        )
        return
    for name in report.created:
        click.echo(f"created  {name} ({report.partitions} partitions)")
    for name in report.unchanged:
        click.echo(f"exists   {name}")
    click.echo(f"provisioned {total} topics: {len(report.created)} created")


@cli.command()
@click.option("--topic", "-t", required=True, help="The queue topic.")
@click.option(
    "--value",
    "values",
    multiple=True,
    help="A message; repeat for more [default: stdin, one per line].",
)
@click.option("--key", "-k", help="Key of every message sent.")
@click.option(
    "--header", "headers", multiple=True, metavar="NAME=VALUE", help="Header; repeatable."
)
@click.option(
    "--delay",
    metavar="DURATION",
    help="Deliver after this long (1s to 7d, e.g. 90s, 2h); needs `kmq delayer` running.",
)
@click.pass_obj
def send(
    settings: KmqSettings,
    topic: str,
    values: tuple[str, ...],
    key: str | None,
    headers: tuple[str, ...],
    delay: str | None,
) -> None:
    """Send messages to TOPIC, now or after --delay."""
    from kmq_dagster.kafka.producer import KmqProducer

    pairs = [_split_header(header) for header in headers]
    delay_s = parse_duration_ms(delay) / 1000 if delay else None
    producer = KmqProducer(settings)
    lines = values or tuple(line.rstrip("\n") for line in sys.stdin)
    for line in lines:
        producer.send(topic, line, key=key, headers=pairs, delay=delay_s)
    pending = producer.flush()
    if pending:
        raise BrokerError(f"{pending} of {len(lines)} messages were not acknowledged by Kafka")
    when = f", due in {delay}; `kmq delayer --topic {topic}` delivers them" if delay else ""
    click.echo(f"sent {len(lines)} messages to {topic}{when}")


def _split_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise click.BadParameter(f"expected NAME=VALUE, got {text!r}", param_hint="--header")
    return name, value


@cli.command()
@click.option("--topic", "-t", required=True, help="The queue topic.")
@click.pass_obj
def delayer(settings: KmqSettings, topic: str) -> None:
    """Deliver TOPIC's delayed messages when due (several may run; partitions are shared)."""
    from kmq_dagster.kafka.delayer import DelayForwarder

    stop_requested = _stop_on_signals()
    forwarder = DelayForwarder(settings, topic)
    log = logging.getLogger("kmq.delayer")
    log.info("delay forwarder for %s started", topic)

    def report_periodically() -> None:
        while not stop_requested.wait(5):
            stats = forwarder.stats
            log.info(
                "delivered %d, moved between levels %d, corrupt %d",
                stats.delivered,
                stats.hopped,
                stats.corrupt,
            )

    threading.Thread(target=report_periodically, daemon=True).start()
    forwarder.run(stop_requested)
    click.echo(f"kmq delayer: stopped after {forwarder.stats.delivered} deliveries")


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or Ctrl-C, so loops finish their step and clean up."""
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop_requested


def _queue_options(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option("--group", "-g", required=True, help="Consumer group.")(command)
    return click.option("--topic", "-t", required=True, help="The queue topic.")(command)


@cli.command()
@_queue_options
@click.option("--handler", required=True, metavar="MODULE:FUNCTION", help="Called per message.")
@click.option(
    "--visibility-timeout",
    metavar="DURATION",
    help="Redeliver a message not acknowledged within this time [default 30s].",
)
@click.option("--max-redeliveries", type=click.IntRange(min=0), help="[default 3]")
@click.option("--batch-size", type=click.IntRange(min=1), help="Messages per fetch [default 500].")
@_retry_options
@click.option(
    "--breaker",
    is_flag=True,
    help="Circuit breaker: stop fetching while the handler fails en masse; its state is shared "
    "by the group's workers through the audit store.",
)
@click.option("--breaker-window", default="30s", show_default=True, metavar="DURATION")
@click.option(
    "--breaker-error-rate",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.5,
    show_default=True,
    help="Failed share of calls in the window that opens it.",
)
@click.option("--breaker-min-calls", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--breaker-cooldown",
    default="10s",
    show_default=True,
    metavar="DURATION",
    help="How long it stays open at first (doubles per failed probe, up to 5m).",
)
@click.option("--breaker-probes", type=click.IntRange(min=1), default=3, show_default=True)
@_audit_url_option
@click.option(
    "--non-retryable",
    metavar="NAMES",
    default="",
    help="Exception type names that go straight to the DLQ, e.g. ValueError,KeyError.",
)
@click.pass_obj
def worker(
    settings: KmqSettings,
    topic: str,
    group: str,
    handler: str,
    visibility_timeout: str | None,
    max_redeliveries: int | None,
    batch_size: int | None,
    retry: RetryOptions,
    breaker: bool,
    breaker_window: str,
    breaker_error_rate: float,
    breaker_min_calls: int,
    breaker_cooldown: str,
    breaker_probes: int,
    audit_url: str | None,
    non_retryable: str,
) -> None:
    """Consume TOPIC in GROUP: returning acknowledges a message, raising retries it later."""
    from kmq_dagster.kafka.consumer import KmqConsumer, wall_clock_ms
    from kmq_dagster.kafka.retry_router import RetryRouter
    from kmq_dagster.kafka.worker import WorkerStats, load_handler, run_worker

    settings = settings.with_overrides(
        visibility_timeout_ms=parse_duration_ms(visibility_timeout) if visibility_timeout else None,
        max_redeliveries=max_redeliveries,
        batch_size=batch_size,
    )
    function = load_handler(handler)
    policy = retry.policy(
        settings, non_retryable=[name.strip() for name in non_retryable.split(",") if name.strip()]
    )
    stop_requested = _stop_on_signals()
    router = RetryRouter(settings, topic, group, policy, clock_ms=wall_clock_ms)
    consumer = KmqConsumer(settings, topic, group, retry_topics=list(router.retry_topics.values()))
    log = logging.getLogger("kmq.worker")
    log.info("worker for %s / group %s started", topic, group)
    last_report = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if time.monotonic() - last_report[0] >= 5:
            last_report[0] = time.monotonic()
            log.info("handled %d, failed %d", stats.handled, stats.failed)

    shared_breaker = None
    if breaker:
        from kmq_dagster.audit.shared_breaker import SharedBreaker, alert_in_store
        from kmq_dagster.audit.store import AuditStore
        from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker

        cooldown_ms = parse_duration_ms(breaker_cooldown)
        config = BreakerConfig(
            window_ms=parse_duration_ms(breaker_window),
            min_calls=breaker_min_calls,
            error_rate=breaker_error_rate,
            cooldown_ms=cooldown_ms,
            max_cooldown_ms=max(cooldown_ms, 300_000),
            probes=breaker_probes,
        )
        store = AuditStore(audit_url)
        shared_breaker = SharedBreaker(
            CircuitBreaker(config),
            topic,
            group,
            store=store,
            on_transition=alert_in_store(store, topic, group),
        )
    stats = run_worker(consumer, function, stop_requested, report, router, breaker=shared_breaker)
    click.echo(f"kmq worker: stopped after {stats.handled} handled, {stats.failed} failed")


@cli.command("spark")
@_queue_options
@click.option(
    "--function",
    "function_spec",
    required=True,
    metavar="MODULE:FUNCTION",
    help="Called per message on the executors; its return value is the result.",
)
@click.option("--output", required=True, help="Parquet dataset the results are appended to.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--max-per-partition", type=click.IntRange(min=1),
              help="Messages per partition and batch at most [default: what a third of the "
              "visibility timeout allows].")  # fmt: skip
@click.option("--visibility-timeout", metavar="DURATION", help="[default 30s]")
@click.option("--forever", is_flag=True, help="Keep running batches (default: stop when idle).")
@_retry_options
@click.option("--non-retryable", metavar="NAMES", default="", help="Types that go to the DLQ.")
@click.pass_obj
def spark_command(
    settings: KmqSettings,
    topic: str,
    group: str,
    function_spec: str,
    output: str,
    master: str,
    max_per_partition: int | None,
    visibility_timeout: str | None,
    forever: bool,
    retry: RetryOptions,
    non_retryable: str,
) -> None:
    """Process TOPIC for GROUP on Spark; each message is acknowledged after its result is
    written to OUTPUT."""
    from kmq_dagster.kafka.worker import load_handler
    from kmq_dagster.spark.job import SparkQueueJob
    from kmq_dagster.spark.session import local_session

    function: Callable[..., object] = load_handler(function_spec)
    if visibility_timeout:
        settings = settings.with_overrides(
            visibility_timeout_ms=parse_duration_ms(visibility_timeout)
        )
    policy = retry.policy(
        settings, non_retryable=[n.strip() for n in non_retryable.split(",") if n.strip()]
    )
    stop_requested = _stop_on_signals()
    session = local_session("kmq spark", master=master)
    job = SparkQueueJob(
        session, settings, topic, group, function=function, output_path=output, policy=policy,
        max_messages_per_partition=max_per_partition,
    )  # fmt: skip
    totals = [0, 0, 0]
    try:
        while not stop_requested.is_set():
            report = job.run_batch()
            totals = [totals[0] + report.read, totals[1] + report.succeeded,
                      totals[2] + report.failed]  # fmt: skip
            click.echo(
                f"batch {report.batch_id}: read {report.read}, succeeded {report.succeeded}, "
                f"failed {report.failed}",
                err=True,
            )
            if report.read == 0 and not forever:
                break
            if report.read == 0:
                stop_requested.wait(1.0)
    finally:
        job.close()
        session.stop()
    click.echo(
        f"kmq spark: read {totals[0]}, succeeded {totals[1]}, failed {totals[2]}; "
        f"results in {output}"
    )


@cli.command()
@_queue_options
@click.option("--max-redeliveries", type=click.IntRange(min=0), help="[default 3]")
@click.pass_obj
def tracker(settings: KmqSettings, topic: str, group: str, max_redeliveries: int | None) -> None:
    """Redeliver GROUP's messages of TOPIC that were not acknowledged in time."""
    from kmq_dagster.kafka.tracker import Tracker

    stop_requested = _stop_on_signals()
    service = Tracker(settings, topic, group, max_redeliveries=max_redeliveries)
    log = logging.getLogger("kmq.tracker")
    log.info("tracker for %s / group %s started", topic, group)

    def report_periodically() -> None:
        while not stop_requested.wait(5):
            stats = service.stats
            log.info(
                "in flight %d, redelivered %d, dead-lettered %d, bad markers %d",
                service.inflight_count(),
                stats.redelivered,
                stats.dead_lettered,
                stats.bad_markers,
            )

    threading.Thread(target=report_periodically, daemon=True).start()
    service.run(stop_requested)
    click.echo(f"kmq tracker: stopped after {service.stats.redelivered} redeliveries")


@cli.command()
@_queue_options
@click.option("--offsets", metavar="P:FIRST-LAST,...", help="DLQ offsets, e.g. 0:10-20,1:5,1:40-.")
@_dead_letter_selection_options
@click.option(
    "--to",
    "target",
    type=click.Choice(["retry", "original"]),
    default="retry",
    show_default=True,
    help="retry: the group's first retry topic (only this group sees it); original: the queue "
    "topic (every group consuming it sees it again).",
)
@click.option("--dry-run", is_flag=True, help="Show what would move; move nothing.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="Copies per second.")
@click.option(
    "--max-replays",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Skip dead letters already replayed this many times.",
)
@click.option("--replay-id", help="Name of this replay; rerunning it resumes [default: derived].")
@_actor_option
@_audit_url_option
@_retry_options
@click.pass_obj
def replay(
    settings: KmqSettings,
    topic: str,
    group: str,
    offsets: str | None,
    key: str | None,
    error_type: str | None,
    since: str | None,
    until: str | None,
    target: str,
    dry_run: bool,
    rate: float | None,
    max_replays: int,
    replay_id: str | None,
    actor: str | None,
    audit_url: str | None,
    retry: RetryOptions,
) -> None:
    """Send GROUP's dead letters of TOPIC back; run the same command again to resume."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.core.replay import ReplaySelection, parse_offsets, parse_time_ms
    from kmq_dagster.kafka.clients import wall_clock_ms
    from kmq_dagster.kafka.replay import ReplayReport, ReplayRequest, replay_dead_letters

    now_ms = wall_clock_ms()
    selection = ReplaySelection(
        offsets=parse_offsets(offsets) if offsets else {},
        key=key.encode() if key is not None else None,
        error_type=error_type,
        since_ms=parse_time_ms(since, now_ms) if since else None,
        until_ms=parse_time_ms(until, now_ms) if until else None,
    )
    request = ReplayRequest(
        topic,
        group,
        selection,
        target=target,
        dry_run=dry_run,
        rate_per_s=rate,
        max_replays=max_replays,
        replay_id=replay_id,
        retry_delays_ms=(retry.policy(settings).nominal_delay_ms(1),),
    )
    click.echo(f"replay {request.id}: {selection.describe()} -> {target}", err=True)
    last_report = [time.monotonic()]

    def progress(report: ReplayReport) -> None:
        if time.monotonic() - last_report[0] >= 2:
            last_report[0] = time.monotonic()
            click.echo(f"scanned {report.scanned}, replayed {report.replayed}", err=True)

    audit = AuditStore(audit_url)
    report = replay_dead_letters(
        settings, request, progress=progress, audit=audit, actor=actor or _default_actor()
    )
    for line in report.listed:
        click.echo(f"  {line}")
    if dry_run and report.movable > len(report.listed):
        click.echo(f"  ... and {report.movable - len(report.listed)} more")
    click.echo(report.summary())


@cli.command()
@_queue_options
@click.option("--once", is_flag=True, help="Ingest what is there now, then exit.")
@_audit_url_option
@click.pass_obj
def ingest(
    settings: KmqSettings, topic: str, group: str, once: bool, audit_url: str | None
) -> None:
    """Copy GROUP's dead letters of TOPIC into the audit store (idempotent; resumable)."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.kafka.dlq_ingest import DlqIngester

    store = AuditStore(audit_url)
    ingester = DlqIngester(settings, store, topic, group)
    if once:
        stats = ingester.ingest_available()
        ingester.close()
    else:
        stop_requested = _stop_on_signals()
        ingester.run(stop_requested)
        stats = ingester.stats
    click.echo(
        f"kmq ingest: {stats.read} dead letters read, {stats.stored} new, "
        f"{stats.already_stored} already stored, in {store.url_for_display}"
    )


@cli.command()
@_queue_options
@_dead_letter_selection_options
@click.option("--dry-run", is_flag=True, help="Count what would be discarded; change nothing.")
@_actor_option
@_audit_url_option
def discard(
    topic: str,
    group: str,
    error_type: str | None,
    key: str | None,
    since: str | None,
    until: str | None,
    dry_run: bool,
    actor: str | None,
    audit_url: str | None,
) -> None:
    """Mark GROUP's stored dead letters of TOPIC as discarded: replays skip them (audited)."""
    from datetime import UTC, datetime

    from kmq_dagster.audit.store import AuditStore, DeadLetterFilter
    from kmq_dagster.core.replay import parse_time_ms
    from kmq_dagster.kafka.clients import wall_clock_ms

    now_ms = wall_clock_ms()

    def moment(text: str | None) -> datetime | None:
        return datetime.fromtimestamp(parse_time_ms(text, now_ms) / 1000, UTC) if text else None

    where = DeadLetterFilter(
        queue_topic=topic,
        group_id=group,
        error_type=error_type,
        key=key.encode() if key is not None else None,
        since=moment(since),
        until=moment(until),
    )
    count = AuditStore(audit_url).discard(where, actor=actor or _default_actor(), dry_run=dry_run)
    click.echo(f"{'would discard' if dry_run else 'discarded'} {count} dead letters")


def _default_actor() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_external_option = click.option(
    "--external",
    is_flag=True,
    help="Use the configured Kafka instead of starting a fresh embedded broker.",
)


@cli.command()
@click.option("--orders", type=click.IntRange(min=20), default=2_000, show_default=True)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("kmq-demo-output"),
    show_default=True,
    help="Where the Spark output goes (replaced on each run).",
)
def demo(orders: int, output_dir: Path) -> None:
    """The whole pipeline on an embedded broker: orders in, priced orders out, a summary."""
    import shutil

    from kmq_dagster.demo import run_demo

    shutil.rmtree(output_dir / "orders_priced.parquet", ignore_errors=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    summary = run_demo(orders, output_dir.resolve(), _report)
    click.echo(summary.table())
    if summary.lost:
        raise KmqError(f"{summary.lost} orders were lost")


@cli.group()
def bench() -> None:
    """Benchmarks; the last line printed is one JSON object of figures."""
    # A benchmark's progress lines are its report: the components' INFO logs (group joins,
    # revocations, trackers catching up) would bury them. -v still shows everything.
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kmq_dagster").setLevel(logging.WARNING)


@bench.command("ack")
@click.option(
    "--messages",
    type=click.IntRange(min=1000),
    default=1_000_000,
    show_default=True,
    help="Messages per throughput run. A million take about a second; 200,000 take 0.15 s, "
    "a quarter of them fetched ahead while the consumer joined its group.",
)
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@_external_option
@click.pass_obj
def bench_ack(settings: KmqSettings, messages: int, rounds: int, external: bool) -> None:
    """Per-message ack against a plain at-least-once consumer, latency, lateness, memory."""
    from kmq_dagster.bench.ack import run_ack_benchmark

    cluster = _bench_cluster(settings, external)
    where = settings.bootstrap_servers if external else "a fresh embedded broker each time"
    _report(f"measuring on {where}; {messages:,} messages of 100 bytes per run")
    figures = run_ack_benchmark(cluster, messages, _report, rounds=rounds)
    click.echo(figures.as_json())


@bench.command("retry")
@click.option(
    "--messages",
    type=click.IntRange(min=100),
    default=10_000,
    show_default=True,
    help="Delayed messages, and as many failing ones.",
)
@click.option(
    "--send-seconds",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Spread the sends over this long; 0 sends one burst (then lateness is backlog).",
)
@click.option(
    "--max-delay",
    default="45s",
    show_default=True,
    metavar="DURATION",
    help="Delays are drawn from 1s to this.",
)
@_external_option
@click.pass_obj
def bench_retry(
    settings: KmqSettings, messages: int, send_seconds: float, max_delay: str, external: bool
) -> None:
    """Due-time precision of delayed and retried messages: early count, lateness p50/p99."""
    from kmq_dagster.bench.retry import run_retry_benchmark
    from kmq_dagster.core.delay import check_delay_ms

    where = settings.bootstrap_servers if external else "a fresh embedded broker"
    _report(f"measuring on {where}")
    cluster = _bench_cluster(settings, external)
    figures = run_retry_benchmark(
        cluster,
        messages,
        _report,
        send_seconds=send_seconds,
        max_delay_ms=check_delay_ms(parse_duration_ms(max_delay)),
    )
    every = figures.lateness.delayed + figures.lateness.retried
    _report(
        f"{len(every):,} due deliveries; earliest {min(every):+.0f} ms, latest {max(every):+.0f} "
        "ms past the due time"
    )
    click.echo(figures.as_json())


@bench.command("audit")
@click.option("--rows", type=click.IntRange(min=100), default=50_000, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--postgres-url",
    metavar="URL",
    help="A PostgreSQL server to create scratch databases on (postgresql+psycopg://...) "
    "[default: start a throwaway one from the machine's PostgreSQL binaries].",
)
@_external_option
@click.pass_obj
def bench_audit(
    settings: KmqSettings, rows: int, rounds: int, postgres_url: str | None, external: bool
) -> None:
    """DLQ ingest rows per second into SQLite and into PostgreSQL."""
    from kmq_dagster.audit.local_postgres import PostgresServer, fresh_database
    from kmq_dagster.bench.audit import run_audit_benchmark

    with contextlib.ExitStack() as stack:
        if postgres_url is None:
            server = stack.enter_context(PostgresServer())
            postgres_url = server.url
            _report(f"started a throwaway PostgreSQL on port {server.port}")
        kafka = stack.enter_context(_bench_cluster(settings, external)())
        server_url = postgres_url
        figures = run_audit_benchmark(
            kafka, lambda: fresh_database(server_url), rows, _report, rounds=rounds
        )
    click.echo(figures.as_json())


@bench.command("spark")
@click.option("--messages", type=click.IntRange(min=1000), default=1_000_000, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@_external_option
@click.pass_obj
def bench_spark(settings: KmqSettings, messages: int, rounds: int, external: bool) -> None:
    """The Spark path against the plain Python worker and plain Spark on the same messages."""
    from kmq_dagster.bench.spark import run_spark_benchmark

    with _bench_cluster(settings, external)() as kafka:
        figures = run_spark_benchmark(kafka, messages, _report, rounds=rounds)
    click.echo(figures.as_json())


def _report(line: str) -> None:
    click.echo(line, err=True)


def _bench_cluster(settings: KmqSettings, external: bool) -> Cluster:
    """The configured Kafka, or a fresh embedded broker per measurement."""
    from kmq_dagster.broker import EmbeddedBroker

    @contextlib.contextmanager
    def cluster() -> Iterator[KmqSettings]:
        if external:
            yield settings
            return
        with EmbeddedBroker(port=0) as embedded:
            yield settings.with_overrides(
                bootstrap_servers=embedded.bootstrap_servers, session_timeout_ms=6_000
            )

    return cluster


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # librdkafka reports connection failures itself; without -v kmq reports them as one line.
    client_level = logging.DEBUG if verbose else logging.CRITICAL + 1
    logging.getLogger("kmq.kafka.client").setLevel(client_level)
    # Migrations are applied on first use; say so only when asked.
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kmq`` console script; errors print as one line, not a traceback."""
    try:
        result = cli.main(args=argv, prog_name="kmq", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("kmq: aborted", err=True)
        return 130
    except KmqError as exc:
        click.echo(f"kmq: error: {exc}", err=True)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
