"""A queue's definition options belong to ``kmq provision``: every other command reads the stored
definition, leaves them out of its help, and refuses them with an error that says where they go.
No broker: the command line is refused before anything connects."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest

from kmq_dagster.cli import cli, main
from kmq_dagster.cli.queue_definition_options import QUEUE_DEFINITION_OPTIONS

#: Each command that works a provisioned queue, with the arguments it needs besides the option.
QUEUE_COMMANDS = {
    "worker": ["worker", "-t", "orders", "-g", "billing", "--handler", "json:loads"],
    "tracker": ["tracker", "-t", "orders", "-g", "billing"],
    "spark": ["spark", "-t", "orders", "-g", "billing", "--function", "json:loads",
              "--output", "/tmp/out"],
    "replay": ["replay", "-t", "orders", "-g", "billing"],
    "ingest": ["ingest", "-t", "orders", "-g", "billing", "--once"],
    "dlq list": ["dlq", "list", "-t", "orders", "-g", "billing"],
    "dlq show": ["dlq", "show", "-t", "orders", "-g", "billing", "0:1"],
}  # fmt: skip


def every_command(group: click.Group, path: str = "kmq") -> Iterator[tuple[str, click.Command]]:
    """Every command of ``kmq``, subcommands of groups included, by its path."""
    for name, command in sorted(group.commands.items()):
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from every_command(command, f"{path} {name}")


def options_of(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def test_only_provision_has_the_queue_definition_options() -> None:
    having = {
        path
        for path, command in every_command(cli)
        if options_of(command) & set(QUEUE_DEFINITION_OPTIONS)
    }

    assert having == {"kmq provision"}
    assert set(QUEUE_DEFINITION_OPTIONS) <= options_of(cli.commands["provision"])


def test_provision_help_shows_the_library_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["provision", "--help"]) == 0

    shown = " ".join(capsys.readouterr().out.split())
    assert "[env KMQ_RETRY_DELAYS; default 10s,1m,10m]" in shown
    assert "[env KMQ_VISIBILITY_TIMEOUT; default 30s]" in shown
    assert "[env KMQ_MAX_REDELIVERIES; default 3]" in shown


@pytest.mark.parametrize("command", sorted(QUEUE_COMMANDS))
@pytest.mark.parametrize("option", QUEUE_DEFINITION_OPTIONS)
def test_a_definition_option_elsewhere_is_refused_saying_where_it_belongs(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*QUEUE_COMMANDS[command], option, "1s"]

    code = main(argv)

    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"kmq: error: {option} is part of the queue's definition, which `kmq provision` stores"
    ), err
    assert f"`kmq provision --topic T --group G --redefine {option} ...`" in err
    assert f"(see `kmq {command} --help`)" in err
