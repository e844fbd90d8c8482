"""Commands that process on Spark: ``kmq spark`` and ``kmq demo``."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kmq_dagster.cli.app import cli, configure_logging, connection_options, settings_of, verbose
from kmq_dagster.cli.options import (
    audit_url_option,
    concurrency_options,
    first_stop_signal,
    metrics_port_option,
    non_retryable_option,
    port_option,
    queue_options,
    serve_metrics_of,
    stop_on_signals,
)
from kmq_dagster.cli.progress import LiveLine, log_file_for
from kmq_dagster.cli.setting_options import setting_option
from kmq_dagster.core.queue_settings import setting_named
from kmq_dagster.errors import KmqError

if TYPE_CHECKING:
    from kmq_dagster.spark.job import BatchReport


@cli.command("spark")
@queue_options
@setting_option(
    setting_named("function"),
    param="function_spec",
    required=True,
    help="Called per message on the executors; its return value is the result.",
)
@setting_option(setting_named("output_path"), param="output", required=True)
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@setting_option(
    setting_named("max_messages_per_partition"),
    note="[default: what a third of the visibility timeout allows]",
)
@concurrency_options(
    concurrency_help="Calls of the function at once per Spark task, for a function that "
    "waits on I/O: threads for a sync function, tasks on one event loop for an async one.",
    ordering_help="With --concurrency above 1: never two messages of one key at once (key), "
    "none (unordered), or one at a time per partition (partition).",
)
@click.option("--forever", is_flag=True, help="Keep running batches (default: stop when idle).")
@non_retryable_option
@audit_url_option
@metrics_port_option
@connection_options
@click.pass_context
def spark_command(
    ctx: click.Context,
    topic: str,
    group: str,
    function_spec: str,
    output: str,
    master: str,
    max_per_partition: int | None,
    concurrency: int,
    ordering: str,
    forever: bool,
    non_retryable: str,
    audit_url: str | None,
    metrics_port: int | None,
) -> None:
    """Process TOPIC for GROUP on Spark; each message is acknowledged after its result is
    written to OUTPUT. No batch starts while the group's circuit breaker (in the audit store)
    is open: the command waits for it."""
    from kmq_dagster.audit.store import AuditStore
    from kmq_dagster.kafka.queues import open_queue
    from kmq_dagster.metrics import spark_snapshot
    from kmq_dagster.spark.job import SparkQueueJob
    from kmq_dagster.spark.processing import OnOpenBreaker, ProcessingReport, run_processing
    from kmq_dagster.spark.session import local_session
    from kmq_dagster.worker.worker import load_handler

    settings = settings_of(ctx)
    function: Callable[..., object] = load_handler(function_spec)
    opened = open_queue(settings, topic, group).with_non_retryable(non_retryable.split(","))
    stop = stop_on_signals()
    session = local_session(
        "kmq spark",
        master=master,
        quiet=not verbose(ctx),
        jvm_log=None if verbose(ctx) else log_file_for("spark-jvm"),
    )
    live = ProcessingReport(output, counting=False)  # what the metrics endpoint reports

    def show(report: BatchReport) -> None:
        live.add(report)
        _show_batch(report)

    job = SparkQueueJob(
        session,
        opened,
        function=function,
        output_path=output,
        max_messages_per_partition=max_per_partition,
        concurrency=concurrency,
        ordering=ordering,
    )
    metrics = serve_metrics_of(metrics_port, "spark", topic, group, lambda: spark_snapshot(live))
    store = AuditStore(audit_url)
    try:
        totals = run_processing(
            job,
            store,
            stop=stop,
            until_idle=not forever,
            on_open_breaker=OnOpenBreaker.WAIT,
            on_batch=show,
            on_breaker_wait=lambda line: click.echo(line, err=True),
            count_output=False,
        )
    finally:
        if metrics is not None:
            metrics.close()
        job.close()
        session.stop()
        store.close()
    click.echo(
        f"kmq spark: read {totals.read}, succeeded {totals.succeeded}, "
        f"failed {totals.failed}; results in {output}"
    )


def _show_batch(report: BatchReport) -> None:
    click.echo(
        f"batch {report.batch_id}: read {report.read}, succeeded {report.succeeded}, "
        f"failed {report.failed}",
        err=True,
    )


@cli.command()
@click.option("--orders", type=click.IntRange(20, 10_000_000), default=2_000, show_default=True)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the Spark output goes (replaced on each run); created private (mode 700) "
    "[default: ~/.kmq/demo].",
)
@click.option(
    "--ui",
    is_flag=True,
    help="Run the demo in Dagster (webserver and daemon) and the console, with a trickle of "
    "orders and a scripted downstream outage, until Ctrl-C.",
)
@port_option("--dagster-port", 3000, "With --ui: the Dagster webserver's port (0: a free one).")
@port_option("--console-port", 8501, "With --ui: the console's port (0: a free one).")
@connection_options
@click.pass_context
def demo(
    ctx: click.Context,
    orders: int,
    output_dir: Path | None,
    ui: bool,
    dagster_port: int,
    console_port: int,
) -> int:
    """The whole pipeline on an embedded broker: orders in, priced orders out, a summary.
    With --ui: the same queue operated from Dagster and the console, until Ctrl-C."""
    import shutil

    from kmq_dagster.demo.pipeline import demo_home, run_demo
    from kmq_dagster.home import private_folder

    output_dir = private_folder((output_dir or demo_home()).resolve())
    if ui:
        from kmq_dagster.demo.ui import run_demo_ui

        if not verbose(ctx):
            configure_logging(quiet=True, log_file=log_file_for("demo-ui"))
        stop = stop_on_signals()
        run_demo_ui(
            output_dir / "ui",
            stop,
            lambda line: click.echo(line, err=True),
            dagster_port=dagster_port or None,
            console_port=console_port or None,
        )
        return 0

    log_file = log_file_for("demo")
    if not verbose(ctx):
        configure_logging(quiet=True, log_file=log_file)
    stop = stop_on_signals()
    shutil.rmtree(output_dir / "orders_priced.parquet", ignore_errors=True)
    progress = LiveLine()
    progress.note(f"kmq demo: logs in {log_file}" if not verbose(ctx) else "kmq demo")
    try:
        summary = run_demo(
            orders,
            output_dir,
            progress,
            stop=stop,
            quiet=not verbose(ctx),
            jvm_log=None if verbose(ctx) else log_file,
        )
    finally:
        progress.done(flush=not stop.is_set())  # no progress line after a stop request
    if summary is None:
        signum = first_stop_signal() or signal.SIGINT
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        click.echo(f"kmq demo: stopped by {name}; everything it started has ended", err=True)
        return 128 + signum
    click.echo(summary.table())
    if summary.lost:
        raise KmqError(f"{summary.lost} orders were lost")
    return 0
