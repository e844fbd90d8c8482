"""``kmq bench ...``: benchmarks that print progress on stderr and, last, one JSON line."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of, verbose
from kmq_dagster.cli.options import report
from kmq_dagster.cli.value_types import Number, duration_option
from kmq_dagster.settings import KmqSettings

FC = TypeVar("FC", bound=Callable[..., Any])


def count_option(name: str, low: int, high: int, default: int, **more: Any) -> Callable[[FC], FC]:
    """An option taking a whole number from ``low`` to ``high``, its default shown."""
    return click.option(
        name, type=click.IntRange(low, high), default=default, show_default=True, **more
    )


def rounds_option(default: int) -> Callable[[FC], FC]:
    """``--rounds``: how many times a benchmark repeats its measurements (1 to 100)."""
    return count_option("--rounds", 1, 100, default)


external_option = click.option(
    "--external",
    is_flag=True,
    help="Use the configured Kafka instead of starting a fresh embedded broker.",
)


@cli.group()
@connection_options
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmarks; the last line printed is one JSON object of figures."""
    # A benchmark's progress lines are its report: the components' INFO logs (group joins,
    # revocations, trackers catching up) would bury them. -v still shows everything.
    if not verbose(ctx):
        logging.getLogger("kmq_dagster").setLevel(logging.WARNING)


@dataclass(frozen=True)
class BenchKafka:
    """The Kafka a benchmark measures on: the configured one with ``--external``, else a
    fresh embedded broker for each measurement."""

    settings: KmqSettings
    external: bool

    @contextlib.contextmanager
    def cluster(self) -> Iterator[KmqSettings]:
        """The Kafka for the length of one measurement (``kafka.cluster`` is a ``Cluster`` of
        :mod:`kmq_dagster.bench.common`)."""
        from kmq_dagster.broker import EmbeddedBroker

        if self.external:
            yield self.settings
            return
        with EmbeddedBroker(port=0) as embedded:
            yield self.settings.with_overrides(
                bootstrap_servers=embedded.bootstrap_servers, session_timeout_ms=6_000
            )

    def where(self, fresh: str = "a fresh embedded broker") -> str:
        """Where the measurements run, for the first progress line."""
        return self.settings.bootstrap_servers if self.external else fresh


def measured_on_kafka(command: Callable[..., None]) -> Callable[..., None]:
    """Adds ``--external`` to a bench command and passes it ``kafka``, a :class:`BenchKafka`
    of the command line's connection settings, in place of both."""

    def with_kafka(ctx: click.Context, /, external: bool, **options: Any) -> None:
        command(BenchKafka(settings_of(ctx), external), **options)

    functools.update_wrapper(with_kafka, command)  # its name and docstring: the help
    return external_option(click.pass_context(with_kafka))


@bench.command("ack")
@count_option(
    "--messages",
    1000,
    100_000_000,
    1_000_000,
    help="Messages per throughput run. A million take about a second; 200,000 take "
    "0.15 s, a quarter of them fetched ahead while the consumer joined its group.",
)
@count_option(
    "--worker-messages",
    1000,
    100_000_000,
    200_000,
    help="Messages per run of the public Worker (concurrency 1, and 100 with a sync and an "
    "async handler) and of the plain no-op consumer it is held against. At concurrency 1 "
    "Worker runs at about 0.6 of a plain consumer's speed (about a million a second on a "
    "quiet 2-core machine), at 100 at about 120,000 a second with a sync handler and "
    "135,000 with an async one.",
)
@rounds_option(5)
@click.option(
    "--latency-seconds",
    type=Number(1, 3600),
    default=10.0,
    show_default=True,
    help="How long each latency run offers its 10,000 msg/s (three runs a round, up to 3 "
    "rounds). In a longer run one stall of the machine weighs less in the percentiles.",
)
@click.option(
    "--tracing",
    is_flag=True,
    help="Also run Worker at concurrency 1 with OpenTelemetry tracing on (spans made and "
    "dropped; needs opentelemetry-sdk): worker_n1_traced_msgs_per_s and tracing_ratio.",
)
@measured_on_kafka
def bench_ack(
    kafka: BenchKafka,
    messages: int,
    worker_messages: int,
    rounds: int,
    latency_seconds: float,
    tracing: bool,
) -> None:
    """Per-message ack against a plain at-least-once consumer; the public Worker against a
    plain consumer calling a no-op function; latency, lateness, memory."""
    from kmq_dagster.bench.ack import run_ack_benchmark

    report(
        f"measuring on {kafka.where('a fresh embedded broker each time')}; {messages:,} "
        f"messages of 100 bytes per consumer run, {worker_messages:,} per Worker run"
    )
    figures = run_ack_benchmark(
        kafka.cluster,
        messages,
        report,
        rounds=rounds,
        worker_messages=worker_messages,
        latency_seconds=latency_seconds,
        tracing=tracing,
    )
    click.echo(figures.as_json())


@bench.command("retry")
@count_option(
    "--messages", 100, 10_000_000, 10_000, help="Delayed messages, and as many failing ones."
)
@click.option(
    "--send-seconds",
    type=Number(0, 3600),
    default=20.0,
    show_default=True,
    help="Spread the sends over this long; 0 sends one burst (then lateness is backlog).",
)
@duration_option("--max-delay", "45s", "Delays are drawn from 1s to this.",
                 min_ms=1_000, max_ms=7 * 86_400_000)  # fmt: skip
@measured_on_kafka
def bench_retry(kafka: BenchKafka, messages: int, send_seconds: float, max_delay: int) -> None:
    """Due-time precision of delayed and retried messages: early count, lateness p50/p99."""
    from kmq_dagster.bench.retry import run_retry_benchmark

    report(f"measuring on {kafka.where()}")
    figures = run_retry_benchmark(
        kafka.cluster,
        messages,
        report,
        send_seconds=send_seconds,
        max_delay_ms=max_delay,
    )
    every = figures.lateness.delayed + figures.lateness.retried
    report(
        f"{len(every):,} due deliveries; earliest {min(every):+.0f} ms, latest "
        f"{max(every):+.0f} ms past the due time"
    )
    click.echo(figures.as_json())


@bench.command("audit")
@count_option("--rows", 100, 100_000_000, 50_000)
@rounds_option(3)
@click.option(
    "--postgres-url",
    metavar="URL",
    help="A PostgreSQL server to create scratch databases on (postgresql+psycopg://...) "
    "[default: start a throwaway one from the machine's PostgreSQL binaries].",
)
@measured_on_kafka
def bench_audit(kafka: BenchKafka, rows: int, rounds: int, postgres_url: str | None) -> None:
    """DLQ ingest rows per second into SQLite and into PostgreSQL."""
    from kmq_dagster.audit.local_postgres import PostgresServer, fresh_database
    from kmq_dagster.bench.audit import run_audit_benchmark

    with contextlib.ExitStack() as stack:
        if postgres_url is None:
            server = stack.enter_context(PostgresServer())
            postgres_url = server.url
            report(f"started a throwaway PostgreSQL on port {server.port}")
        settings = stack.enter_context(kafka.cluster())
        server_url = postgres_url
        figures = run_audit_benchmark(
            settings, lambda: fresh_database(server_url), rows, report, rounds=rounds
        )
    click.echo(figures.as_json())


@bench.command("spark")
@count_option("--messages", 1000, 100_000_000, 1_000_000)
@rounds_option(3)
@measured_on_kafka
def bench_spark(kafka: BenchKafka, messages: int, rounds: int) -> None:
    """The Spark path against the plain Python worker and plain Spark on the same messages."""
    from kmq_dagster.bench.spark import run_spark_benchmark

    with kafka.cluster() as settings:
        figures = run_spark_benchmark(settings, messages, report, rounds=rounds)
    click.echo(figures.as_json())


@bench.command("console")
@count_option("--dead-letters", 1_000, 100_000_000, 1_000_000)
@count_option("--runs", 1, 100, 7)
@click.option("--postgres-url", metavar="URL",
              help="A PostgreSQL server to create a scratch database on [default: start a "
              "throwaway one from the machine's PostgreSQL binaries].")  # fmt: skip
def bench_console(dead_letters: int, runs: int, postgres_url: str | None) -> None:
    """The console's page, counts and detail times with many dead letters, both backends."""
    from kmq_dagster.bench.console import scratch_stores
    from kmq_dagster.bench.console_queries import run_console_benchmark

    figures = run_console_benchmark(scratch_stores(postgres_url), dead_letters, runs, report)
    click.echo(json.dumps(figures))


@bench.command("faults")
@click.option(
    "--only",
    metavar="NAMES",
    help="Run only these scenarios, comma-separated: broker_crash, broker_stall, kill_storm, "
    "million_in_flight, audit_store_down.",
)
@click.option(
    "--scale",
    type=Number(0, 1, low_open=True),
    default=1.0,
    show_default=True,
    help="Share of each scenario's messages (1 = the full sizes: 20,000, 200,000, a million).",
)
@duration_option("--outage", "30s", "How long the broker stalls and the audit store is down.",
                 min_ms=1_000, max_ms=3_600_000)  # fmt: skip
@duration_option("--storm", "2m", "How long the kill storm lasts (a kill every 5 s).",
                 min_ms=10_000, max_ms=3_600_000)  # fmt: skip
def bench_faults(only: str | None, scale: float, outage: int, storm: int) -> None:
    """Broker crash and stall, kill storm, a million in flight, audit store down: lost and
    duplicate messages per scenario, and the tracker's memory."""
    from kmq_dagster.bench.faults import FaultSizes, run_fault_benchmark
    from kmq_dagster.errors import KmqError

    sizes = FaultSizes(stall_s=outage / 1000, audit_down_s=outage / 1000, storm_s=storm / 1000)
    chosen = [name.strip() for name in only.split(",") if name.strip()] if only else None
    figures = run_fault_benchmark(sizes.scaled(scale), report, only=chosen)
    click.echo(figures.as_json())
    problems = figures.failures()
    if problems:
        raise KmqError("; ".join(problems))


@bench.command("dagster")
@count_option("--messages", 1000, 100_000_000, 100_000)
@count_option("--ticks", 1, 1000, 11, help="Timed ticks.")
@measured_on_kafka
def bench_dagster(kafka: BenchKafka, messages: int, ticks: int) -> None:
    """Sensor tick time at 64 partitions; sensor-launched runs against kmq spark."""
    from kmq_dagster.bench.dagster import run_dagster_benchmark

    with kafka.cluster() as settings:
        figures = run_dagster_benchmark(settings, messages, report, ticks=ticks)
    click.echo(figures.as_json())


@bench.command("parallel")
@count_option(
    "--messages", 100, 10_000_000, 10_000, help="Messages of Parallel Consumer's shape per run."
)
@count_option("--keys", 1, 1_000_000, 100)
@count_option("--concurrency", 2, 10_000, 100, help="Handler calls at once in the shape's runs.")
@count_option(
    "--io-messages", 100, 100_000_000, 100_000, help="Messages of the I/O scale run (20 ms each)."
)
@count_option("--io-concurrency", 2, 100_000, 1_000)
@count_option(
    "--noop-messages",
    100,
    100_000_000,
    300_000,
    help="Messages of each no-op run at one call at a time.",
)
@rounds_option(3)
@count_option(
    "--rss-backlog", 0, 100_000_000, 0, metavar="N",
    help="Also drain a backlog of N messages through a slow handler and sample the "
    "worker's RSS every second (1000000: a few minutes).",
)  # fmt: skip
@measured_on_kafka
def bench_parallel(
    kafka: BenchKafka,
    messages: int,
    keys: int,
    concurrency: int,
    io_messages: int,
    io_concurrency: int,
    noop_messages: int,
    rounds: int,
    rss_backlog: int,
) -> None:
    """Parallel Consumer's benchmark shape in each ordering, sync and async; an I/O scale run;
    the no-op handler at concurrency 1 against the call path before async handlers."""
    from kmq_dagster.bench.parallel import ParallelSizes, run_parallel_benchmark

    sizes = ParallelSizes(
        messages=messages, keys=keys, concurrency=concurrency, io_messages=io_messages,
        io_concurrency=io_concurrency, noop_messages=noop_messages,
        noop_concurrent_messages=min(noop_messages, ParallelSizes.noop_concurrent_messages),
        rounds=rounds,
    )  # fmt: skip
    where = kafka.where("a fresh embedded broker per round")
    report(
        f"measuring on {where}: {messages:,} messages, {keys} keys, 1 partition, waits of "
        f"0-5 ms, concurrency {concurrency}; times run from the first handler call to the last "
        "acknowledgement (group joins not timed)"
    )
    figures = run_parallel_benchmark(kafka.cluster, sizes, report, rss_backlog=rss_backlog)
    for line in figures.table():
        report(line)
    report(
        "noop_n1 is kmq worker's default path (concurrency 1: calls on the loop's own thread, "
        "through HandlerCall, which awaits what it returns); noop_n1_direct is the same loop "
        "calling the handler directly, as before async handlers: their ratio is the "
        "regression at N = 1. noop_concurrent_loop is the same loop at concurrency 2 "
        "(one partition: its messages run in runs on one handler thread), for context."
    )
    click.echo(figures.as_json())


@bench.command("loop")
@count_option("--messages", 1_000, 100_000_000, 200_000, help="Messages per run.")
@count_option("--rounds", 1, 100, 5)
def bench_loop(messages: int, rounds: int) -> None:
    """The CPU a message costs in the worker loop alone (an in-memory consumer, no broker), at
    concurrency 1 and at 100 with sync and async no-op handlers."""
    from kmq_dagster.bench.loop_cost import run_loop_benchmark

    report(f"measuring the worker loop on an in-memory consumer: {messages:,} messages per run")
    costs = run_loop_benchmark(messages, rounds, report)
    for line in costs.table():
        report(line)
    click.echo(costs.as_json())


@bench.command("tracker")
@rounds_option(4)
@measured_on_kafka
def bench_tracker(kafka: BenchKafka, rounds: int) -> None:
    """How soon a `kmq tracker` process is ready (first of its group, restarted, beside
    another) and how long a stop in its first seconds takes."""
    from kmq_dagster.bench.tracker_start import run_tracker_start_benchmark

    report(
        f"measuring on {kafka.where()}: kmq tracker processes on a fresh "
        f"4-partition queue per round, {rounds} rounds"
    )
    with kafka.cluster() as settings:
        figures = run_tracker_start_benchmark(settings, report, rounds=rounds)
    click.echo(figures.as_json())
