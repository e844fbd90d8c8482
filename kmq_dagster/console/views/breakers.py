"""Breakers & alerts: every shared circuit breaker's state and since when, its transitions,
and the alerts raised."""

from __future__ import annotations

import streamlit as st

from kmq_dagster.console import queries, session
from kmq_dagster.console.overview_format import alert_rows, breaker_rows, transition_rows
from kmq_dagster.console.rendering import static_table

#: Alerts and transitions listed, newest first (a table that wraps long texts grows with each).
ALERTS_SHOWN = TRANSITIONS_SHOWN = 50


def show() -> None:
    store = session.store()
    states = queries.breakers(store)
    _section(
        "Circuit breakers",
        breaker_rows(states),
        "No circuit breaker has been used (kmq worker --breaker).",
    )
    _section(
        "Transitions",
        transition_rows(queries.recent_transitions(store, limit=TRANSITIONS_SHOWN)),
        "No transitions recorded.",
    )
    _section(
        "Alerts",
        alert_rows(queries.recent_alerts(store, limit=ALERTS_SHOWN)),
        "No alerts raised.",
    )


def _section(title: str, rows: list[dict[str, object]], when_empty: str) -> None:
    """A titled table of ``rows``, or the ``when_empty`` line when there are none. A static
    table: long texts (a transition's reason, an alert) show whole, wrapped, never cut to a
    column's edge."""
    st.subheader(title)
    if not rows:
        st.text(when_empty)
    else:
        st.table(static_table(rows), hide_index=True)


session.principal()
st.title("Breakers & alerts")
st.fragment(run_every=session.config().refresh_s)(show)()
