"""The console's login gate: nobody sees a page before it has a principal.

Three ways in, in this order:

1. ``--no-auth`` (``KMQ_CONSOLE_AUTH=none``): everyone is an admin, so the console only agrees
   to it when it serves on a loopback address.
2. OIDC through ``st.login`` when Streamlit's ``secrets.toml`` has an ``[auth]`` section; the
   users file may give an identity (its e-mail) a role, others get the default role.
3. Otherwise a name and password checked against the users file (argon2 hashes), throttled
   and audited by :mod:`kmq_dagster.console.login_guard`.

Whatever the way in, the principal is checked again on every run (see
:mod:`kmq_dagster.console.session`): role re-read, removal and idle expiry take effect at once.
"""

from __future__ import annotations

import getpass
import socket

import streamlit as st

from kmq_dagster.console import session
from kmq_dagster.console.auth import ADMIN, Principal, UsersFile
from kmq_dagster.console.config import ConsoleConfig, is_loopback
from kmq_dagster.console.login_guard import log_in
from kmq_dagster.console.session import (
    ENDED_KEY,
    PRINCIPAL_KEY,
    oidc_providers,
    reported_errors,
)

__all__ = ["log_out", "logged_in", "login_page", "oidc_providers"]
#: The client of a session Streamlit gives no address (it hides loopback addresses).
UNKNOWN_CLIENT = "localhost"


def logged_in(config: ConsoleConfig) -> Principal | None:
    """The principal of this session as it stands now, or ``None`` (then the login page)."""
    if config.no_auth:
        return _local_admin()
    providers = oidc_providers()
    found = _oidc(config) if providers is not None else st.session_state.get(PRINCIPAL_KEY)
    if not isinstance(found, Principal):
        return None
    current = session.current_principal(config, found)
    if current is None:
        reason = st.session_state.get(ENDED_KEY)
        log_out(config)
        st.session_state[ENDED_KEY] = reason
    return current


def login_page() -> None:
    """The page shown to a session without a principal."""
    st.title("kmq console")
    ended = st.session_state.pop(ENDED_KEY, None)
    if ended:
        st.info(ended)
    with reported_errors():
        _login_form(ConsoleConfig.from_env())


def _login_form(config: ConsoleConfig) -> None:
    if config.no_auth:
        st.error(
            "The console was started without authentication on a non-loopback address. "
            "Serve it on 127.0.0.1, or configure OIDC or a users file."
        )
        return
    providers = oidc_providers()
    if providers is not None:
        st.text("Log in with your identity provider.")
        choices: list[str | None] = [*providers] or [None]
        for provider in choices:
            label = "Log in" if provider is None else f"Log in with {provider}"
            if st.button(label, key=f"login-{provider}"):
                st.login(provider)
        return
    users = UsersFile(config.users_file)
    if not users.entries():
        st.warning(
            "No users yet. Add one with `kmq console add-user NAME --role admin`, "
            "or configure OIDC."
        )
    with st.form("login"):
        name = st.text_input("User name")
        password = st.text_input("Password", type="password")
        submitted = st.form_submit_button("Log in", type="primary")
    if submitted:
        client = st.context.ip_address or UNKNOWN_CLIENT
        principal = log_in(users, name, password, client, session.attempt(session.audit_store))
        if principal is None:
            st.error("Wrong user name or password.")
        else:
            session.start_session(principal)
            st.rerun()


def log_out(config: ConsoleConfig) -> None:
    session.end_session(None)
    if oidc_providers() is not None and not config.no_auth:
        st.logout()


def _local_admin() -> Principal | None:
    if not is_loopback(st.get_option("server.address") or ""):
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Principal(f"{user}@{socket.gethostname()} (no auth)", ADMIN)


def _oidc(config: ConsoleConfig) -> Principal | None:
    if not st.user.is_logged_in:
        return None
    identity = str(st.user.get("email") or st.user.get("sub") or "")
    if not identity:
        return None
    role = UsersFile(config.users_file).role_of(identity) or config.oidc_default_role
    return Principal(identity, role)
