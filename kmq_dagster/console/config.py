"""The console's configuration: ``kmq console`` passes its options to the Streamlit process
in these environment variables, which ``streamlit run ui/app.py`` users may set themselves."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.console.auth import check_role
from kmq_dagster.console.masking import DEFAULT_MASKED_NAMES, Masker
from kmq_dagster.errors import ConfigError

#: ``none``: no login (loopback only); anything else: OIDC or the users file.
AUTH_ENV = "KMQ_CONSOLE_AUTH"
NO_AUTH = "none"
USERS_FILE_ENV = "KMQ_CONSOLE_USERS_FILE"
#: Extra sensitive header and JSON field names, comma-separated (added to the defaults).
MASKED_FIELDS_ENV = "KMQ_CONSOLE_MASKED_FIELDS"
#: The role of an OIDC identity the users file does not name.
OIDC_DEFAULT_ROLE_ENV = "KMQ_CONSOLE_OIDC_DEFAULT_ROLE"
#: Seconds between two refreshes of the Overview.
REFRESH_ENV = "KMQ_CONSOLE_REFRESH_S"
DEFAULT_REFRESH_S = 10
#: Where ``kmq console`` serves by default: Streamlit's port, on this machine only.
DEFAULT_PORT = 8501
DEFAULT_ADDRESS = "127.0.0.1"


def default_users_file() -> Path:
    """``~/.kmq/console-users.json``."""
    return Path.home() / ".kmq" / "console-users.json"


@dataclass(frozen=True)
class ConsoleConfig:
    audit_url: str
    no_auth: bool
    users_file: Path
    masker: Masker
    oidc_default_role: str = "viewer"
    refresh_s: float = DEFAULT_REFRESH_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConsoleConfig:
        from kmq_dagster.audit.store import default_url

        env = os.environ if environ is None else environ
        extra = [name for name in env.get(MASKED_FIELDS_ENV, "").split(",") if name.strip()]
        users_file = env.get(USERS_FILE_ENV)
        return cls(
            audit_url=env.get("KMQ_AUDIT_URL") or default_url(),
            no_auth=env.get(AUTH_ENV, "").strip().lower() == NO_AUTH,
            users_file=Path(users_file) if users_file else default_users_file(),
            masker=Masker.of([*DEFAULT_MASKED_NAMES, *extra]),
            oidc_default_role=check_role(env.get(OIDC_DEFAULT_ROLE_ENV, "viewer")),
            refresh_s=_seconds(env.get(REFRESH_ENV)),
        )


def _seconds(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_REFRESH_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ConfigError(f"{REFRESH_ENV} must be a positive number of seconds, got {raw!r}")
    return seconds


def is_loopback(address: str) -> bool:
    """Whether serving on ``address`` is reachable from this machine only.

    An empty address means every interface (Streamlit's default): not loopback.
    """
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False
