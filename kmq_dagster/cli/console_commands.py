"""``kmq console``: start the DLQ console; ``kmq console add-user``: give someone a login."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of
from kmq_dagster.console.auth import ROLES, UsersFile
from kmq_dagster.console.config import DEFAULT_ADDRESS, DEFAULT_PORT, ConsoleConfig
from kmq_dagster.core.wording import article


@cli.group("console", invoke_without_command=True)
@connection_options
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--address",
    default=DEFAULT_ADDRESS,
    show_default=True,
    help="Address to serve on; 0.0.0.0 for every interface (needs OIDC or a users file).",
)
@click.option(
    "--audit-url",
    metavar="URL",
    help="SQLAlchemy URL of the audit store [env KMQ_AUDIT_URL; default sqlite:///~/.kmq/audit.db].",
)
@click.option("--no-auth", is_flag=True, help="No login, everyone an admin: loopback only.")
@click.option(
    "--users-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Users and password hashes [env KMQ_CONSOLE_USERS_FILE; default "
    "~/.kmq/console-users.json].",
)
@click.pass_context
def console(
    ctx: click.Context,
    port: int,
    address: str,
    audit_url: str | None,
    no_auth: bool,
    users_file: Path | None,
) -> None:
    """The DLQ console (Streamlit): browse, inspect, replay and discard dead letters."""
    if ctx.invoked_subcommand is not None:
        return
    from kmq_dagster.console.launcher import LaunchOptions, launch

    options = LaunchOptions(port, address, audit_url, no_auth, users_file)
    launch(options, users_file or ConsoleConfig.from_env().users_file, settings_of(ctx))


@console.command("add-user")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--oidc", is_flag=True, help="An OIDC identity (its e-mail): a role, no password.")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
@click.pass_context
def add_user(ctx: click.Context, name: str, role: str, oidc: bool, password_stdin: bool) -> None:
    """Add (or replace) user NAME with ROLE in the users file."""
    from kmq_dagster.console.launcher import local_admin

    given = ctx.parent.params.get("users_file") if ctx.parent else None
    users = UsersFile(given or ConsoleConfig.from_env().users_file)
    password = None
    if not oidc:
        password = (
            sys.stdin.readline().rstrip("\n")
            if password_stdin
            else click.prompt("Password", hide_input=True, confirmation_prompt=True)
        )
    users.add(local_admin(), name, role, password)
    click.echo(f"kmq console: {name} is {article(role)} {role} in {users.path}")
