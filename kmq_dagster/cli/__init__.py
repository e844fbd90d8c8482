"""The ``kmq`` command. Its subcommands and their output are a public interface.

Each module holds thin commands (options in, one library call, output out):
``queue_commands`` (provision, worker, tracker, delayer), ``send_command`` (send),
``processing_commands`` (spark, demo), ``dead_letter_commands`` (replay, ingest, discard),
``dlq_commands`` (dlq list, dlq show), ``status_commands`` (status), ``console_commands``
(console, console add-user), ``broker_commands`` and ``bench_commands``; ``app`` is the root
group and the error contract, ``options`` the options and value types they share.
"""

from __future__ import annotations

from kmq_dagster.cli import (  # noqa: F401 - importing a module registers its commands
    bench_commands,
    broker_commands,
    console_commands,
    dead_letter_commands,
    dlq_commands,
    processing_commands,
    queue_commands,
    send_command,
    status_commands,
)
from kmq_dagster.cli.app import cli, main

__all__ = ["cli", "main"]
