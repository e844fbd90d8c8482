"""``kmq dlq list`` and ``kmq dlq show``: a queue's dead letters, read from its DLQ topic."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of
from kmq_dagster.cli.options import (
    DeadLetterSource,
    dead_letter_selection_options,
    dead_letter_source_options,
)
from kmq_dagster.core.replay import ReplaySelection
from kmq_dagster.core.terminal_text import escape_control
from kmq_dagster.core.wording import counted


@cli.group()
def dlq() -> None:
    """Browse a queue's dead letters from the terminal (no audit store needed)."""


@dlq.command("list")
@dead_letter_source_options
@dead_letter_selection_options(offsets=True)
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
@connection_options
@click.pass_context
def dlq_list(
    ctx: click.Context,
    source: DeadLetterSource,
    selection: ReplaySelection,
    limit: int,
    as_json: bool,
) -> None:
    """The first dead letters of GROUP's DLQ (or of --dlq-topic) that the filters select,
    partition by partition."""
    from kmq_dagster.operations.dead_letter_reader import list_dead_letters

    opened = source.open(settings_of(ctx))
    page = list_dead_letters(opened, selection, limit=limit)
    for letter in page.letters:
        summary = _summary(letter.partition, letter.offset, letter.key, letter.row)
        click.echo(json.dumps(summary) if as_json else _line(summary))
    if not as_json:
        more = f"; more match (raise --limit above {limit})" if page.more else ""
        click.echo(
            f"{counted(len(page.letters), 'dead letter')} shown of {page.scanned} read{more}"
        )


@dlq.command("show")
@dead_letter_source_options
@click.argument("where", metavar="PARTITION:OFFSET")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@connection_options
@click.pass_context
def dlq_show(
    ctx: click.Context,
    source: DeadLetterSource,
    where: str,
    as_json: bool,
) -> None:
    """One dead letter in full: its error, headers, traceback and value."""
    from kmq_dagster.core.masking import masker_from_env
    from kmq_dagster.core.rendering import render_bytes
    from kmq_dagster.operations.dead_letter_reader import show_dead_letter

    partition, _, offset = where.partition(":")
    if not (partition.isdigit() and offset.isdigit()):
        raise click.BadParameter(f"expected PARTITION:OFFSET, got {where!r}", param_hint="WHERE")
    opened = source.open(settings_of(ctx))
    letter = show_dead_letter(opened, int(partition), int(offset))
    masker = masker_from_env(os.environ)
    kind, value = render_bytes(letter.value, masker=masker)
    summary = _summary(letter.partition, letter.offset, letter.key, letter.row)
    headers = [[name, render_bytes(raw, 200)[1]] for name, raw in letter.masked_headers]
    if as_json:
        click.echo(
            json.dumps(
                {
                    **summary,
                    "headers": headers,
                    "value_kind": kind,
                    "value": value,
                    "traceback": letter.traceback,
                }
            )
        )
        return
    # Message data is the producer's text: escaped, so it cannot drive the terminal.
    for name, shown in summary.items():
        click.echo(f"{name:<16} {escape_control(str(shown))}")
    click.echo("headers")
    for name, shown in headers:
        click.echo(f"  {escape_control(name)} = {escape_control(shown)}")
    if letter.traceback:
        click.echo(f"traceback\n{escape_control(letter.traceback, keep_newlines=True)}")
    click.echo(
        f"value ({kind}, {summary['value_size']} bytes)\n"
        f"{escape_control(value, keep_newlines=True)}"
    )


def _summary(partition: int, offset: int, key: bytes | None, row: dict[str, Any]) -> dict[str, Any]:
    original = (
        f"{row['original_topic']}[{row['original_partition']}]@{row['original_offset']}"
        if row["original_topic"]
        else None
    )
    return {
        "at": f"{partition}:{offset}",
        "dead_lettered": _iso(row["last_failure_at"]),
        "key": None if key is None else key.decode("utf-8", errors="replace"),
        "error_type": row["error_type"],
        "reason": row["reason"],
        "error_message": row["error_message"],
        "attempts": row["attempts"],
        "original": original,
        "value_size": row["value_size"],
    }


def _line(summary: dict[str, Any]) -> str:
    """One dead letter on one line, its message data escaped (see ``escape_control``)."""
    reason = summary["reason"]
    reason = reason if len(reason) <= 60 else reason[:57] + "..."
    key, error_type = escape_control(str(summary["key"])), escape_control(summary["error_type"])
    return (
        f"{summary['at']:<10} {summary['dead_lettered']}  key={key:<12} "
        f"{error_type:<20} {escape_control(reason)}"
    )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
