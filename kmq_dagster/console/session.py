"""What every page of the console shares: configuration, the audit store, Kafka settings, the
logged-in principal, and how errors are shown (as one line, never as a traceback).

The principal is checked again on every run of a page or fragment (every action): its role is
re-read from the users file (or the OIDC claims' entry), a user removed from the file is logged
out at once, and a session idle for longer than ``KMQ_CONSOLE_IDLE_TIMEOUT_S`` must log in again.
Only a full run of the app (a person clicking or typing) counts as activity; a fragment's timed
refresh does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import streamlit as st

from kmq_dagster.audit.browse import refresh_statistics
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import Principal, UsersFile
from kmq_dagster.console.config import ConsoleConfig
from kmq_dagster.console.rendering import escape_markdown
from kmq_dagster.errors import KmqError
from kmq_dagster.settings import KmqSettings

PRINCIPAL_KEY = "kmq_principal"
ACTIVITY_KEY = "kmq_activity"
#: Why the last session ended (shown on the login page).
ENDED_KEY = "kmq_session_ended"
T = TypeVar("T")


@dataclass
class Activity:
    """When this session last acted; download callables, which run outside the page script,
    read the same object to tell whether the session is still logged in."""

    last_s: float
    ended: bool = False

    def live(self, now_s: float, idle_timeout_s: float) -> bool:
        return not self.ended and now_s - self.last_s <= idle_timeout_s


def config() -> ConsoleConfig:
    return ConsoleConfig.from_env()


#: How often the console refreshes the planner's statistics of the audit store.
STATISTICS_EVERY_S = 3_600


@st.cache_resource(show_spinner=False)
def _store(url: str) -> tuple[AuditStore, list[float]]:
    return AuditStore(url), [-STATISTICS_EVERY_S - 1.0]


def store() -> AuditStore:
    """The audit store, for a session whose principal is still valid: pages *and* their timed
    fragments read through here, so an idle or removed user's screen stops refreshing."""
    principal()
    return audit_store()


def audit_store() -> AuditStore:
    """The audit store (one per URL and console process), its statistics refreshed hourly."""
    found, refreshed = _store(config().audit_url)
    if time.monotonic() - refreshed[0] > STATISTICS_EVERY_S:
        refreshed[0] = time.monotonic()
        refresh_statistics(found)
    return found


def kafka_settings() -> KmqSettings:
    return KmqSettings.from_env()


def principal() -> Principal:
    """The logged-in principal as the users file has them now; stops the page (after saying
    why) when there is none any more: removed, or idle past the limit."""
    found = st.session_state.get(PRINCIPAL_KEY)
    current = current_principal(config(), found) if isinstance(found, Principal) else None
    if current is None:
        end_session(None if isinstance(found, Principal) else "Not logged in.")
        st.error(escape_markdown(st.session_state.get(ENDED_KEY) or "Not logged in."))
        st.stop()
    st.session_state[PRINCIPAL_KEY] = current
    return current


def current_principal(settings: ConsoleConfig, found: Principal) -> Principal | None:
    """``found`` with the role the users file (or its OIDC entry) gives them now, or ``None``
    if their session is idle past the limit or their entry is gone."""
    if settings.no_auth:
        return found
    if not activity().live(time.monotonic(), settings.idle_timeout_s):
        st.session_state[ENDED_KEY] = (
            f"Your session was idle for more than {settings.idle_timeout_s:g} s: log in again."
        )
        return None
    users = UsersFile(settings.users_file)
    if oidc_providers() is not None:
        return Principal(found.name, users.role_of(found.name) or settings.oidc_default_role)
    current = users.current(found)
    if current is None:
        st.session_state[ENDED_KEY] = f"{found.name} is no longer a user of this console."
    return current


def activity() -> Activity:
    """This session's activity record (a session logged in before it had one starts now)."""
    found = st.session_state.get(ACTIVITY_KEY)
    if not isinstance(found, Activity):
        found = st.session_state[ACTIVITY_KEY] = Activity(time.monotonic())
    return found


def touch() -> None:
    """Count this run as the session's activity (a full run: a person clicked or typed)."""
    activity().last_s = time.monotonic()


def start_session(found: Principal) -> None:
    st.session_state[PRINCIPAL_KEY] = found
    st.session_state[ACTIVITY_KEY] = Activity(time.monotonic())
    st.session_state.pop(ENDED_KEY, None)


def end_session(reason: str | None) -> None:
    """Forget the principal; what download buttons drawn before can fetch ends with it."""
    st.session_state.pop(PRINCIPAL_KEY, None)
    found = st.session_state.pop(ACTIVITY_KEY, None)
    if isinstance(found, Activity):
        found.ended = True
    if reason:
        st.session_state[ENDED_KEY] = reason


def may_download(settings: ConsoleConfig) -> Callable[[], bool]:
    """A check, for a download callable (run outside the page script), that this session is
    still logged in: not ended, not idle, its user still in the users file."""
    found = st.session_state.get(PRINCIPAL_KEY)
    record = activity()
    oidc = oidc_providers() is not None

    def allowed() -> bool:
        if settings.no_auth:
            return True
        if not isinstance(found, Principal):
            return False
        if not record.live(time.monotonic(), settings.idle_timeout_s):
            return False
        return oidc or UsersFile(settings.users_file).current(found) is not None

    return allowed


def oidc_providers() -> list[str] | None:
    """``None`` without an ``[auth]`` secrets section; else the named providers (``[]``: one
    unnamed provider configured directly under ``[auth]``)."""
    try:
        section: Any = st.secrets.get("auth")
    except Exception:  # no secrets file at all is the common case, not an error
        return None
    if not section:
        return None
    return sorted(name for name, value in dict(section).items() if hasattr(value, "keys"))


@contextmanager
def reported_errors() -> Iterator[None]:
    """Show a :class:`KmqError` (bad input, refused action, unreachable broker) as one line."""
    try:
        yield
    except KmqError as exc:
        st.error(escape_markdown(str(exc)), icon=":material/error:")


def attempt(action: Callable[[], T]) -> T | None:
    """``action()``, or ``None`` after showing its :class:`KmqError` as one line."""
    try:
        return action()
    except KmqError as exc:
        st.error(escape_markdown(str(exc)), icon=":material/error:")
        return None
