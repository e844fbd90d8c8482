"""``kmq broker``: the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kmq_dagster.cli.app import cli
from kmq_dagster.cli.options import port_option, stop_on_signals
from kmq_dagster.errors import BrokerError
from kmq_dagster.settings import DEFAULT_BROKER_PORT


@cli.command()
@port_option("--port", DEFAULT_BROKER_PORT, "Loopback port to serve Kafka on; 0 picks a free one.")
@click.option(
    "--data-dir",
    metavar="DIRECTORY",
    help="Keep topics, messages and offsets here across restarts (default: in memory).",
)
def broker(port: int, data_dir: str | None) -> None:
    """Run the embedded Kafka-compatible broker in the foreground until Ctrl-C or SIGTERM."""
    from kmq_dagster.broker import EmbeddedBroker

    if data_dir is not None and not data_dir.strip():
        raise click.BadParameter("give a directory, not an empty path", param_hint="--data-dir")

    stop = stop_on_signals()
    embedded = EmbeddedBroker(port=port, data_dir=None if data_dir is None else Path(data_dir))
    try:
        embedded.start()
        click.echo(
            f"kmq broker: serving Kafka on {embedded.bootstrap_servers}, "
            f"storage {embedded.storage_description}; Ctrl-C stops it"
        )
        click.echo(f"export KMQ_BOOTSTRAP_SERVERS={embedded.bootstrap_servers}")
        sys.stdout.flush()
        while not stop.wait(0.5):
            failure = embedded.failed_child()
            if failure:
                raise BrokerError(f"the broker stopped unexpectedly: {failure}")
    finally:
        embedded.stop()
    click.echo("kmq broker: stopped")
