"""``kmq bench console``: the console's page, counts-by-cause and detail times with a million
dead letters, in SQLite and in PostgreSQL; the last line printed is one JSON object.

The measurement itself is in :mod:`kmq_dagster.bench.console_queries` (imported when the
command runs, so ``kmq`` starts fast).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click


@contextlib.contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kmq-bench-console-") as scratch:
        yield f"sqlite:///{Path(scratch) / 'audit.db'}"


@click.command("console")
@click.option("--dead-letters", type=click.IntRange(min=1_000), default=1_000_000,
              show_default=True)  # fmt: skip
@click.option("--runs", type=click.IntRange(min=1), default=7, show_default=True)
@click.option("--postgres-url", metavar="URL",
              help="A PostgreSQL server to create a scratch database on [default: start a "
              "throwaway one from the machine's PostgreSQL binaries].")  # fmt: skip
def console(dead_letters: int, runs: int, postgres_url: str | None) -> None:
    """The console's page, counts and detail times with many dead letters, both backends."""
    from kmq_dagster.audit.local_postgres import PostgresServer, fresh_database
    from kmq_dagster.bench.console_queries import run_console_benchmark

    @contextlib.contextmanager
    def postgres() -> Iterator[str]:
        if postgres_url is not None:
            yield fresh_database(postgres_url)
            return
        with PostgresServer() as server:
            yield server.url

    def report(line: str) -> None:
        click.echo(line, err=True)

    figures = run_console_benchmark(
        {"sqlite": _sqlite, "postgres": postgres}, dead_letters, runs, report
    )
    click.echo(json.dumps(figures))
