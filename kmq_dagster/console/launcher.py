"""Start the console: check the options, then replace this process with Streamlit serving
``app.py`` from the installed package (no repository needed).

The checks happen before Streamlit starts, so a mistake is one clear line: ``--no-auth`` on a
non-loopback address, no users and no OIDC, an audit store that cannot be opened.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import ADMIN, Principal, UsersFile
from kmq_dagster.console.config import (
    AUTH_ENV,
    DEFAULT_ADDRESS,
    DEFAULT_PORT,
    NO_AUTH,
    USERS_FILE_ENV,
    is_loopback,
)
from kmq_dagster.errors import ConfigError
from kmq_dagster.settings import KmqSettings

APP = Path(__file__).resolve().parent / "app.py"


@dataclass(frozen=True)
class LaunchOptions:
    port: int = DEFAULT_PORT
    address: str = DEFAULT_ADDRESS
    audit_url: str | None = None
    no_auth: bool = False
    users_file: Path | None = None


def secrets_files(cwd: Path | None = None) -> list[Path]:
    """Where Streamlit looks for ``secrets.toml`` by default."""
    return [Path.home() / ".streamlit" / "secrets.toml",
            (cwd or Path.cwd()) / ".streamlit" / "secrets.toml"]  # fmt: skip


def oidc_configured(files: list[Path]) -> bool:
    """Whether one of ``files`` has an ``[auth]`` section (then the console uses ``st.login``).

    Raises:
        ConfigError: a secrets file that is not TOML.
    """
    for path in files:
        if not path.is_file():
            continue
        try:
            if "auth" in tomllib.loads(path.read_text()):
                return True
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return False


def check(options: LaunchOptions, users_file: Path, secrets: list[Path]) -> None:
    """Refuse a console nobody could log in to, or everybody could.

    Raises:
        ConfigError: ``--no-auth`` on a non-loopback address; no OIDC and no users.
        AuditStoreError: the audit store cannot be opened.
    """
    if options.no_auth:
        if not is_loopback(options.address):
            raise ConfigError(
                f"--no-auth serves on a loopback address only, not {options.address!r}: "
                "anyone reaching it would be an admin. Use --address 127.0.0.1, or configure "
                "OIDC or a users file"
            )
    elif not oidc_configured(secrets) and not UsersFile(users_file).entries():
        raise ConfigError(
            f"nobody can log in: no OIDC [auth] section in {secrets[0]} or {secrets[1]}, and no "
            f"users in {users_file}. Add one with `kmq console add-user NAME --role admin`, or "
            "use --no-auth on this machine only"
        )
    AuditStore(options.audit_url).close()


def environment(
    options: LaunchOptions, users_file: Path, settings: KmqSettings, base: Mapping[str, str]
) -> dict[str, str]:
    """The Streamlit process's environment: the console's options and the Kafka settings."""
    env = dict(base)
    env["KMQ_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers
    for key, value in settings.client_config.items():
        env["KMQ_KAFKA_" + key.upper().replace(".", "_")] = str(value)
    if options.audit_url:
        env["KMQ_AUDIT_URL"] = options.audit_url
    env[USERS_FILE_ENV] = str(users_file)
    env[AUTH_ENV] = NO_AUTH if options.no_auth else "login"
    return env


def streamlit_argv(options: LaunchOptions) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(options.port),
        "--server.address", options.address,
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
        "--client.showErrorDetails", "type",
    ]  # fmt: skip


def launch(options: LaunchOptions, users_file: Path, settings: KmqSettings) -> NoReturn:
    """Check ``options``, then become the Streamlit server (same process id)."""
    check(options, users_file, secrets_files())
    env = environment(options, users_file, settings, os.environ)
    print(
        f"kmq console: serving on http://{options.address}:{options.port}"
        + (" without login (loopback only)" if options.no_auth else ""),
        file=sys.stderr,
        flush=True,
    )
    os.execve(sys.executable, streamlit_argv(options), env)


def local_admin() -> Principal:
    """Whoever runs ``kmq console add-user`` on this machine: they can write the users file
    anyway, so they act as an admin."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Principal(f"{user}@{socket.gethostname()}", ADMIN)
