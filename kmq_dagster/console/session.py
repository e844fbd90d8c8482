"""What every page of the console shares: configuration, the audit store, Kafka settings, the
logged-in principal, and how errors are shown (as one line, never as a traceback)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import streamlit as st

from kmq_dagster.audit.browse import refresh_statistics
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import Principal
from kmq_dagster.console.config import ConsoleConfig
from kmq_dagster.console.rendering import escape_markdown
from kmq_dagster.errors import KmqError
from kmq_dagster.settings import KmqSettings

PRINCIPAL_KEY = "kmq_principal"
T = TypeVar("T")


def config() -> ConsoleConfig:
    return ConsoleConfig.from_env()


#: How often the console refreshes the planner's statistics of the audit store.
STATISTICS_EVERY_S = 3_600


@st.cache_resource(show_spinner=False)
def _store(url: str) -> tuple[AuditStore, list[float]]:
    return AuditStore(url), [-STATISTICS_EVERY_S - 1.0]


def store() -> AuditStore:
    """The audit store (one per URL and console process), its statistics refreshed hourly."""
    found, refreshed = _store(config().audit_url)
    if time.monotonic() - refreshed[0] > STATISTICS_EVERY_S:
        refreshed[0] = time.monotonic()
        refresh_statistics(found)
    return found


def kafka_settings() -> KmqSettings:
    return KmqSettings.from_env()


def principal() -> Principal:
    """The logged-in principal; the app's login gate guarantees there is one."""
    found = st.session_state.get(PRINCIPAL_KEY)
    if not isinstance(found, Principal):
        st.error("Not logged in.")
        st.stop()
    return found


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
