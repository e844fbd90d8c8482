"""The console's configuration: ``kmq console`` passes its options to the Streamlit process
in these environment variables, which ``streamlit run ui/app.py`` users may set themselves."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.console.auth import check_role
from kmq_dagster.console.masking import Masker, masker_from_env
from kmq_dagster.core.durations import seconds_from_env

#: ``none``: no login (loopback only); anything else: OIDC or the users file.
AUTH_ENV = "KMQ_CONSOLE_AUTH"
NO_AUTH = "none"
USERS_FILE_ENV = "KMQ_CONSOLE_USERS_FILE"
#: Extra secret-name patterns, comma-separated (added to the defaults); ``KMQ_MASKED_FIELDS``
#: is the same setting for the console and the DLQ ingester alike.
MASKED_FIELDS_ENV = "KMQ_CONSOLE_MASKED_FIELDS"
#: Seconds a logged-in session may stay idle before it has to log in again.
IDLE_TIMEOUT_ENV = "KMQ_CONSOLE_IDLE_TIMEOUT_S"
DEFAULT_IDLE_TIMEOUT_S = 1_800
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
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConsoleConfig:
        from kmq_dagster.audit.store import default_url

        env = os.environ if environ is None else environ
        users_file = env.get(USERS_FILE_ENV)
        return cls(
            audit_url=env.get("KMQ_AUDIT_URL") or default_url(),
            no_auth=env.get(AUTH_ENV, "").strip().lower() == NO_AUTH,
            users_file=Path(users_file) if users_file else default_users_file(),
            masker=masker_from_env(env),
            oidc_default_role=check_role(env.get(OIDC_DEFAULT_ROLE_ENV, "viewer")),
            refresh_s=seconds_from_env(env, REFRESH_ENV, DEFAULT_REFRESH_S),
            idle_timeout_s=seconds_from_env(env, IDLE_TIMEOUT_ENV, DEFAULT_IDLE_TIMEOUT_S),
        )


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
