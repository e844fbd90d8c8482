"""The ``kmq`` command. Its subcommands and their output are a public interface.

Each module holds thin commands (options in, one library call, output out):
``queue_commands`` (provision, send, worker, tracker, delayer), ``processing_commands``
(spark, demo), ``dead_letter_commands`` (replay, ingest, discard), ``dlq_commands`` (dlq list,
dlq show), ``status_commands`` (status), ``broker_commands`` and ``bench_commands``; ``app`` is
the root group and the error contract, ``options`` the options and value types they share.
"""

from __future__ import annotations

import importlib

from kmq_dagster.cli import (  # noqa: F401 - importing a module registers its commands
    bench_commands,
    broker_commands,
    dead_letter_commands,
    dlq_commands,
    processing_commands,
    queue_commands,
    status_commands,
)
from kmq_dagster.cli.app import cli, main
from kmq_dagster.cli.bench_commands import bench

# The console keeps its commands beside its code (kmq console, kmq bench console).
cli.add_command(importlib.import_module("kmq_dagster.console.command").console)
bench.add_command(importlib.import_module("kmq_dagster.bench.console").console)

__all__ = ["cli", "main"]
